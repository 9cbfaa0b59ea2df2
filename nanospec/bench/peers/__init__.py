"""Outside engines run on `compare`'s prompts beside this engine's rows (`--peer`): vLLM for now."""

from .vllm_peer import (ENGINE, KINDS, PeerRun, PeerSpec, PeerTarget, VllmPeer, default_python, parse_peers,
                        peer_target, probe)

__all__ = ["ENGINE", "KINDS", "PeerRun", "PeerSpec", "PeerTarget", "VllmPeer", "default_python", "parse_peers",
           "peer_target", "probe"]

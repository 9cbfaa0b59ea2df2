"""Outside engines run on `compare`'s prompts beside this engine's rows (`--peer`): vLLM for now."""

from .vllm_peer import PeerRun, PeerSpec, PeerTarget, VllmPeer, default_python, parse_peers

__all__ = ["PeerRun", "PeerSpec", "PeerTarget", "VllmPeer", "default_python", "parse_peers"]

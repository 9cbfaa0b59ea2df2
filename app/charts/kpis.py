"""The run's headline numbers as a row of cards, and the break-even τ: where speculation pays on this machine."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nanospec import metrics
from nanospec.decoding.cost_curve import CostCurve
from nanospec.events import ACCEPT_SOURCES
from nanospec.timing import DRAFT_PHASES

from app.charts.words import plural
from app.templating import render

CARD_BACKGROUND = "rgba(127,127,127,0.04)"
# the τ card against the break-even τ: above it speculation pays; within `CLOSE` below it, about a tie
PAYS, CLOSE_TO_IT, LOSES = "#2e9d5b", "#c77c02", "#d64545"
CLOSE = 0.9


def kpi_from_summary(summary) -> dict:
    """The run's headline numbers (what `kpi_html` shows) from its `RunSummary`."""
    return {"tokens": summary.new_tokens, "steps": summary.steps, "tokens_per_s": summary.tokens_per_s,
            "tau": summary.tau if summary.steps else math.nan, "mean_active": summary.mean_active,
            "active_frac": summary.active_frac, "vocab_size": summary.vocab_size, "coverage": summary.coverage,
            "draft_share": summary.draft_share, "accepted_by_source": dict(summary.accepted_by_source),
            "decode_tokens_per_s": summary.decode_tokens_per_s, "ttft_ms": summary.ttft_ms}


# -- where speculation pays ----------------------------------------------------------------------
@dataclass(frozen=True)
class BreakEven:
    """The τ above which the run's speculative steps beat plain decoding on the machine whose cost curve
    priced them (`nanospec.metrics.break_even_tau`), or None with the reason it is unknown."""

    tau: float | None
    reason: str = ""
    plain_ms: float = math.nan   # the curve's one-token forward: a plain step
    verify_ms: float = math.nan  # the curve's forward over the run's mean verified tokens per step
    draft_ms: float = math.nan   # the run's mean drafting per step (its trace's draft phases)
    other_ms: float = math.nan   # the run's mean bookkeeping per step (every other phase but the forward)
    verified: float = math.nan   # mean tokens per verification forward (root included)

    def explain(self) -> str:
        """One sentence for the card's hover."""
        if self.tau is None:
            return f"Break-even τ unknown: {self.reason}."
        return (f"Speculation beats plain decoding here when a step emits more than {self.tau:.2f} tokens on "
                f"average: verifying {self.verified:.1f} tokens ({self.verify_ms:.1f} ms on this machine's measured "
                f"cost curve) plus drafting ({self.draft_ms:.1f} ms) and bookkeeping ({self.other_ms:.1f} ms) "
                f"take {self.tau:.2f}× a plain one-token step ({self.plain_ms:.1f} ms).")

    def colour(self, tau: float) -> str | None:
        """The τ card's colour for a run with mean accepted length `tau`: green above break-even, amber
        just below it, red further below; None when either is unknown."""
        if self.tau is None or tau is None or math.isnan(tau):
            return None
        return PAYS if tau > self.tau else CLOSE_TO_IT if tau >= CLOSE * self.tau else LOSES


def usable_curve(curve: Mapping | None) -> CostCurve | None:
    """The cost curve a run recorded (`CostCurve.to_dict()` and more), or None for a missing or malformed one
    (a replayed trace's meta is whatever the file held)."""
    if not isinstance(curve, Mapping):
        return None
    try:
        return CostCurve.from_dict(dict(curve))
    except (KeyError, TypeError, ValueError):
        return None


def break_even(events: Sequence, curve: Mapping | None) -> BreakEven:
    """The break-even τ of a run (`events`: its `StepEvent`s) priced by the pair's cost curve: a plain step is
    the curve's one-token forward; a speculative step is the curve's forward over the run's mean verified
    tokens, plus the run's mean measured drafting and bookkeeping per decode step."""
    steps = [e for e in events if e.step > 0]
    if events and events[0].method == "ar":
        return BreakEven(None, "plain decoding drafts nothing, so there is no break-even to reach")
    if not steps:
        return BreakEven(None, "no decode step yet")
    priced = usable_curve(curve)
    if priced is None:
        return BreakEven(None, "no cost curve measured for this pair on this device (a run with the draft "
                               "budget on measures one)")
    n = len(steps)
    verified = sum(len(e.tree_tokens) for e in steps) / n
    draft = sum(e.draft_ms for e in steps) / n
    other = sum(ms for e in steps for p, ms in e.phases.items()
                if p not in DRAFT_PHASES and p != "verify_forward") / n
    plain, verify = priced.one_token_ms, priced.ms_at(verified)
    tau = metrics.break_even_tau(plain, verify, draft, other)
    if math.isnan(tau):
        return BreakEven(None, "the cost curve has no positive one-token time")
    return BreakEven(tau, "", plain, verify, draft, other, verified)


# -- the cards -------------------------------------------------------------------------------------
def card(label: str, value: str, sub: str = "", colour: str | None = None, about: str = "",
         elem_id: str = "") -> str:
    """One KPI card; `colour` tints its value and background, `about` is its hover."""
    attrs = (f" id='{elem_id}'" if elem_id else "") + (f" title='{html.escape(about, quote=True)}'" if about else "")
    return render("kpi_card.html", label=label, value=value, sub=sub, attrs=attrs,
                  background=f"color-mix(in srgb, {colour} 12%, transparent)" if colour else CARD_BACKGROUND,
                  value_style=f";color:{colour}" if colour else "")


def break_even_card(found: BreakEven) -> str:
    if found.tau is None:
        return card("pays above τ = – here", "–", html.escape(found.reason), about=found.explain(),
                    elem_id="kpi-break-even")
    sub = (f"verify {found.verify_ms:.0f} + draft {found.draft_ms:.0f} + other {found.other_ms:.0f} ms "
           f"vs plain {found.plain_ms:.0f} ms")
    return card(f"pays above τ = {found.tau:.2f} here", f"{found.tau:.2f}", sub, about=found.explain(),
                elem_id="kpi-break-even")


def tau_card(values: dict, found: BreakEven | None) -> str:
    tau = values.get("tau", math.nan)
    colour = found.colour(tau) if found is not None else None
    about = ""
    if colour is not None:
        side = "above" if tau > found.tau else "below"
        about = (f"τ {tau:.2f} is {side} the break-even τ {found.tau:.2f}: speculation "
                 + ("pays on this machine" if side == "above" else "does not pay on this machine"))
    return card("τ (tokens per target forward)", "–" if math.isnan(tau) else f"{tau:.2f}",
                plural(values.get('steps', 0), "decode step"), colour, about, "kpi-tau")


def kpi_html(values: dict, break_even_at: BreakEven | None = None) -> str:
    """A row of KPI cards (inline styles, so the page needs no extra CSS); with `break_even_at`, the τ card is
    coloured against it and a card says above which τ speculation pays here."""
    tps = values.get("tokens_per_s", math.nan)
    cov = values.get("coverage")
    active = values.get("mean_active", 0.0)
    active = 0.0 if active is None or math.isnan(active) else active  # no decode step yet: no mean
    decode = values.get("decode_tokens_per_s", math.nan)
    ttft = values.get("ttft_ms", math.nan)
    cards = [
        card("decode tokens/s", "–" if math.isnan(decode) else f"{decode:.1f}",
             f"{values.get('tokens', 0)} tokens · {'–' if math.isnan(tps) else f'{tps:.1f}'}/s with prefill"),
        card("time to first token", "–" if math.isnan(ttft) else
             (f"{ttft / 1e3:.2f} s" if ttft >= 1e3 else f"{ttft:.0f} ms"), "the prompt's prefill"),
        tau_card(values, break_even_at),
        *([break_even_card(break_even_at)] if break_even_at is not None else []),
        card("mean active size", f"{active:,.0f}" if active else "–",
             f"{values.get('active_frac', 0.0):.1%} of V = {values.get('vocab_size', 0):,}" if active else "no drafter"),
        card("coverage", "–" if cov is None else f"{cov:.1%}", "emitted tokens that were in the active set"),
        card("draft-time share", f"{values.get('draft_share', 0.0):.1%}", "of decode wall time"),
    ]
    by_source = values.get("accepted_by_source") or {}
    accepted = sum(by_source.values())
    if by_source.get("copy") or by_source.get("both"):  # the copy branch supplied something
        share = {k: by_source.get(k, 0) / accepted for k in ACCEPT_SOURCES}
        cards.append(card("accepted drafts from the copy chain", f"{share['copy'] + share['both']:.1%}",
                          f"copy only {share['copy']:.0%} · also drafted by the head {share['both']:.0%} · "
                          f"head only {share['head']:.0%}"))
    return render("kpi_row.html", cards="".join(cards))

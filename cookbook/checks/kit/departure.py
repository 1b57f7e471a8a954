"""The one rule for two runs that part: where, and whether that is the dtype's noise or a wrong state.

A probe runs the same greedy request twice (a solo run and the same request in a batch, in a burst, resumed after
preemption; a cold run and a prefix-cache hit) and finds the first generated token where they differ. Batch shape,
a cached prefix and a chunk boundary change the kernels, so bf16 numerics move and a near-tie can flip: vLLM does
not promise batch invariance. The truth at that position is what a correct forward pass of the model gives, so the
model's fp32 reference (cookbook.reference) ranks the two tokens there:

- within the reference tie margin of each other (the dtype's measured noise): a tie, reported with both margins;
- the reference clearly prefers the token the run under test lost: a fail;
- the reference clearly prefers the run's own token: the baseline was the one off (the oracle judges baselines);
  the run under test is right.

Without a reference (a Gaudi recipe with no golden file for these prompts, or the reference turned off) both runs'
own top-k judge: a tie only when each run had the two tokens within the served-vs-served tie margin. The same goes
for the logprobs of the tokens both runs share: a difference beyond the served-vs-served tolerance is noise when
both runs sit within the reference tolerance of the reference's logprob, and a fail when one does not.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ...completions import Trace
from ...reference import RefPosition
from .tolerances import MEAN_Z, Tolerance, mean_bound

Verdict = Literal["tie", "fail", "baseline-off", "unjudged"]


def first_departure(baseline: Trace, run: Trace) -> int | None:
    """The first step where the two runs took different tokens (or one ended first), else None."""
    for index, (a, b) in enumerate(zip(baseline.token_ids, run.token_ids)):
        if a != b:
            return index
    if len(baseline.token_ids) != len(run.token_ids):
        return min(len(baseline.token_ids), len(run.token_ids))
    return None


def _own_margin(top: dict[int, float], own: int | None, other: int | None) -> tuple[float | None, float | None]:
    """A run's logprob of its own token minus the other's, from its top-k; when the other is not listed, a lower
    bound (its own minus the floor of the list) in the second place."""
    if own is None or other is None or own not in top:
        return None, None
    if other in top:
        return top[own] - top[other], None
    return None, (top[own] - min(top.values())) if top else None


class Departure(BaseModel):
    """Where a run first parts from its baseline, both runs' and the reference's view of the two tokens there, and
    the verdict."""

    position: int = Field(description="0-based index in the generated tokens")
    baseline_token: int | None = Field(description="The baseline's token there; None where its answer had ended")
    run_token: int | None = Field(description="The run's token there; None where its answer had ended")
    baseline_top: dict[int, float] = Field(default_factory=dict, description="The baseline's top-k there")
    run_top: dict[int, float] = Field(default_factory=dict, description="The run's top-k there")
    baseline_margin: float | None = Field(
        None, description="Baseline: logprob of its token minus the run's token; None if the run's is not in its top-k"
    )
    run_margin: float | None = Field(
        None, description="Run: logprob of its token minus the baseline's token; None if not in its top-k"
    )
    reference_margin: float | None = Field(
        None, description="Reference: logprob of the baseline's token minus the run's (positive: it prefers the "
        "baseline's); None without a reference or when both are outside its top-k"
    )
    reference_bound: Literal["exact", "at least", "at most"] | None = Field(
        None, description="'at least'/'at most': one token is outside the reference's top-k, the margin is a bound"
    )
    reference_source: str | None = Field(None, description="Which reference ranked the two tokens")
    baseline: str = Field("baseline", description="What the run is compared with, in words: 'the solo run', 'the cold run'")
    tie_margin: float = Field(description="The margin within which the two are a tie")
    tie_margin_from: str
    verdict: Verdict
    judged_by: str = Field(description="What the verdict rests on, in words")
    after: str | None = Field(
        None, description="Set on a step of the run's own continuation: the near-tie where the runs first parted "
        "(`baseline_token` is then the reference's own choice on the run's path, not the baseline's)"
    )

    @property
    def failed(self) -> bool:
        return self.verdict in ("fail", "unjudged")

    def describe(self) -> str:
        """One line: the tokens, the margins, the verdict."""
        def side(token: int | None) -> str:
            return f"token {token}" if token is not None else "the end of the answer"

        margins = []
        if self.baseline_margin is not None:
            margins.append(f"{self.baseline}'s margin {self.baseline_margin:.3g}")
        if self.run_margin is not None:
            margins.append(f"this run's margin {self.run_margin:.3g}")
        if self.reference_margin is not None:
            bound = "" if self.reference_bound in (None, "exact") else f"{self.reference_bound} "
            margins.append(f"reference margin {bound}{self.reference_margin:.3g}")
        shown = f" ({', '.join(margins)})" if margins else ""
        if self.after is not None:
            head = (f"step {self.position} of this run's own continuation, after {self.after}: {self.baseline} took "
                    f"{side(self.baseline_token)}, this run {side(self.run_token)}{shown}")
        else:
            head = (f"first differing token {self.position}: {self.baseline} took {side(self.baseline_token)}, this "
                    f"run {side(self.run_token)}{shown}")
        return f"{head}: {self.verdict}, {self.judged_by}"


class Ranking(BaseModel):
    """The reference's ranking of two tokens at one position: the core of the one rule."""

    verdict: Literal["tie", "fail", "baseline-off"]
    margin: float | None = Field(description="Reference logprob of the expected token minus the other's")
    bound: Literal["exact", "at least", "at most"] = Field(
        description="'at least'/'at most' when one token is outside the reference's top-k: the margin is a bound"
    )
    note: str

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"


def rank_by_reference(ref: RefPosition, expected: int, other: int, noise: float) -> Ranking | None:
    """`expected` (the baseline's token, or the reference's own argmax) against `other` (what the run under test
    chose), by the reference's distribution `ref` at that position; None when both are outside its top-k.

    Within `noise` of each other: a tie. The reference prefers `expected` by more: a fail. It prefers `other` by
    more: the baseline was the one off. A token outside the top-k is at most as likely as the list's floor, so the
    margin is then a bound, and a bound that does not clear `noise` is a tie."""
    a, b = ref.logprob_of(expected), ref.logprob_of(other)
    listed = f"the reference's top {len(ref.top)}"
    if a is not None and b is not None:
        margin, bound = a - b, "exact"
    elif a is not None:
        margin, bound = a - ref.floor(), "at least"
    elif b is not None:
        margin, bound = ref.floor() - b, "at most"
    else:
        return None
    if margin > noise and bound != "at most":
        verdict: Literal["tie", "fail", "baseline-off"] = "fail"
        note = (f"token {other} is ranked {'more than ' if bound == 'at least' else ''}{margin:.3f} below token "
                f"{expected} by the reference (tie margin {noise:g})")
    elif margin < -noise and bound != "at least":
        verdict = "baseline-off"
        note = (f"the reference ranks token {other} {'more than ' if bound == 'at most' else ''}{-margin:.3f} above "
                f"token {expected} (tie margin {noise:g})")
    else:
        verdict = "tie"
        outside = f"; one is outside {listed}, whose floor is within the margin" if bound != "exact" else ""
        note = f"tokens {expected} and {other} are {abs(margin):.3f} apart in the reference (tie margin {noise:g}){outside}"
    return Ranking(verdict=verdict, margin=round(margin, 5), bound=bound, note=note)


def judge_departure(
    baseline: Trace,
    run: Trace,
    position: int,
    reference: RefPosition | None,
    reference_source: str | None,
    flip_noise: Tolerance,
    runs_tie: Tolerance,
    why_no_reference: str = "",
    runs_drift: float = 0.0,
    baseline_name: str = "the baseline",
) -> Departure:
    """The verdict at `position` (from `first_departure`). `reference`: the reference's distribution of the token at
    that position given the prompt and the tokens both runs share (None: no reference could score it). Without one,
    a tie needs the baseline's own margin within `runs_tie` and the run's within `runs_tie + runs_drift` (the run's
    logprobs may move by the served-vs-served drift)."""
    a, _, a_top = baseline.at(position)
    b, _, b_top = run.at(position)
    base_margin, base_at_least = _own_margin(a_top, a, b)
    run_margin, run_at_least = _own_margin(b_top, b, a)
    found = Departure(position=position, baseline_token=a, run_token=b, baseline_top=a_top, run_top=b_top,
                      baseline_margin=_round(base_margin), run_margin=_round(run_margin), baseline=baseline_name,
                      tie_margin=flip_noise.value, tie_margin_from=flip_noise.source, verdict="unjudged", judged_by="")
    if a is None or b is None:
        found.judged_by = "one answer ended here (same max_tokens, ignore_eos): the runs differ in length"
        return found
    if reference is not None:
        ranking = rank_by_reference(reference, a, b, flip_noise.value)
        if ranking is not None:
            return _judged_by_reference(found, ranking, reference_source or "the reference", flip_noise)
        why_no_reference = f"both tokens are outside the reference's top {len(reference.top)}"
    found.tie_margin, found.tie_margin_from = runs_tie.value, runs_tie.source
    base = base_margin if base_margin is not None else base_at_least
    other = run_margin if run_margin is not None else run_at_least
    exact = base_margin is not None and run_margin is not None
    tie = exact and base is not None and other is not None and base <= runs_tie.value
    tie = tie and other is not None and other <= runs_tie.value + runs_drift  # a token missing from a top-k: not near
    found.verdict = "tie" if tie else "fail"
    missing = [f"token {t} is not in {who} top {len(top)}" for t, who, top, m in
               ((b, f"{baseline_name}'s", a_top, base_margin), (a, "this run's", b_top, run_margin)) if m is None]
    relation = "within" if tie else "not within"
    said = "; ".join(missing) if missing else f"both runs' own top-k put the two {relation} {runs_tie.value:g}"
    found.judged_by = (f"{said} (tie margin {runs_tie.value:g}, {runs_tie.source}); no reference "
                       f"({why_no_reference or 'none available'})")
    return found


def judge_continuation(
    run: Trace, first: Departure, path: list[RefPosition | None] | None, reference_source: str | None,
    flip_noise: Tolerance,
) -> Departure | None:
    """After a near-tie the two runs part for good, so the baseline says nothing more; the reference scoring the
    run's own tokens (`path[j]`: the reference at run step j given the prompt and the run's tokens before it) still
    does. The first later step where it clearly prefers another token than the run took is a fail (a defect whose
    first visible flip lands on a near-tie is caught a few tokens on); None when every later step is the reference's
    own choice or a near-tie."""
    if path is None or first.failed:
        return None
    where = (f"the near-tie at step {first.position} (tokens {first.baseline_token} and {first.run_token}"
             + (f", reference margin {first.reference_margin:.3g})" if first.reference_margin is not None else ")"))
    for j in range(first.position + 1, min(len(run.token_ids), len(path))):
        ref, token = path[j], run.token_ids[j]
        if ref is None or token == ref.argmax:
            continue
        ranking = rank_by_reference(ref, ref.argmax, token, flip_noise.value)
        if ranking is None or not ranking.failed:
            continue
        _, _, top = run.at(j)
        run_margin, _ = _own_margin(top, token, ref.argmax)
        found = Departure(position=j, baseline_token=ref.argmax, run_token=token, baseline_top=dict(ref.top),
                          run_top=top, run_margin=_round(run_margin), baseline="the reference on this run's path",
                          tie_margin=flip_noise.value, tie_margin_from=flip_noise.source, verdict="unjudged",
                          judged_by="", after=where)
        return _judged_by_reference(found, ranking, reference_source or "the reference", flip_noise)
    return None


def _judged_by_reference(found: Departure, ranking: Ranking, source: str, noise: Tolerance) -> Departure:
    found.reference_margin = ranking.margin
    found.reference_bound = ranking.bound
    found.reference_source = source
    found.verdict = ranking.verdict
    said = {
        "tie": f"the reference puts the two within {noise.value:g} of each other: a near-tie the dtype's rounding can flip",
        "fail": f"the reference prefers {found.baseline}'s token by more than {noise.value:g}: this run lost the right token",
        "baseline-off": f"the reference prefers this run's token by more than {noise.value:g}: {found.baseline} was "
                        "the one off here, the run under test is right",
    }[ranking.verdict]
    found.judged_by = f"{said} (tie margin from {noise.source}; {source})"
    return found


class Drift(BaseModel):
    """The logprobs of the tokens both runs share: the worst difference, and whether it is noise or a fault."""

    compared: int = Field(description="Shared leading tokens whose logprobs were compared")
    max_diff: float | None = Field(description="Max |run - baseline| over them; None if none")
    position: int | None = Field(None, description="Where the max is")
    allowed: float
    allowed_from: str
    verdict: Literal["within", "noise", "fail"]
    note: str = ""


def judge_drift(
    baseline: Trace,
    run: Trace,
    shared: int,
    allowed: Tolerance,
    reference_path: list[RefPosition | None] | None,
    reference_max: float,
    reference_source: str | None = None,
    reference_mean: float | None = None,
) -> Drift:
    """`reference_path[j]`: the reference at shared step j (None: not scored). Differences beyond `allowed` are
    noise only when both runs sit near the reference as a clean served run does: within `reference_max` of it at
    every such step, and within `reference_mean` of it on average over the shared steps (a run whose every logprob
    moved by the same amount is off, however small each step's move)."""
    diffs = [abs(x - y) for x, y in zip(baseline.logprobs[:shared], run.logprobs[:shared])]
    worst = max(range(len(diffs)), key=lambda i: diffs[i]) if diffs else None
    drift = Drift(compared=len(diffs), max_diff=_round(diffs[worst]) if worst is not None else None, position=worst,
                  allowed=allowed.value, allowed_from=allowed.source, verdict="within")
    beyond = [i for i, d in enumerate(diffs) if d > allowed.value]
    if not beyond:
        return drift
    source = reference_source or "the reference"
    if not reference_path:
        drift.verdict = "fail"
        drift.note = f"no reference to tell noise from a fault ({allowed.source} allows {allowed.value:g})"
        return drift
    offs = []
    for i in range(len(diffs)):
        ref = reference_path[i] if i < len(reference_path) else None
        if ref is None or ref.token_id != baseline.token_ids[i]:
            if i in beyond:
                drift.verdict = "fail"
                drift.note = f"the reference did not score step {i}"
                return drift
            continue
        offs.append((i, abs(baseline.logprobs[i] - ref.logprob), abs(run.logprobs[i] - ref.logprob), ref.logprob))
    i, base_off, run_off, ref_lp = max((o for o in offs if o[0] in beyond), key=lambda o: max(o[1], o[2]))
    if max(base_off, run_off) > reference_max:
        drift.verdict = "fail"
        drift.note = (f"at step {i} {baseline.logprobs[i]:.3f} in the baseline, {run.logprobs[i]:.3f} in this run, "
                      f"{ref_lp:.3f} in the reference: one is more than {reference_max:g} from it ({source})")
        return drift
    means = (sum(o[1] for o in offs) / len(offs), sum(o[2] for o in offs) / len(offs))
    if reference_mean is not None:
        bounds = (mean_bound(reference_mean, [o[1] for o in offs]), mean_bound(reference_mean, [o[2] for o in offs]))
        if means[0] > bounds[0] or means[1] > bounds[1]:
            drift.verdict = "fail"
            drift.note = (f"on average over {len(offs)} shared steps the baseline sits {means[0]:.3g} and this run "
                          f"{means[1]:.3g} from the reference: more than a clean run does ({reference_mean:g}, plus "
                          f"{MEAN_Z:g} standard errors of these steps: {bounds[0]:.3g} and {bounds[1]:.3g}; {source})")
            return drift
    drift.verdict = "noise"
    drift.note = (f"at step {i} {baseline.logprobs[i]:.3f} in the baseline, {run.logprobs[i]:.3f} in this run, "
                  f"{ref_lp:.3f} in the reference: both within {reference_max:g} of it, and within "
                  f"{reference_mean if reference_mean is not None else reference_max:g} on average ({source})")
    return drift


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 5)

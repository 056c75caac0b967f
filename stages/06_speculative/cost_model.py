"""Adaptive drafting (vLLM's ``enable_adaptive_verification``): how many drafts each request feeds, by measurement.

A draft row pays only while a step is bound by reading the weights (machine, load and workload decide; README:
"Drafting only where it pays"). `StepCost` fits t(rows) = a + b * rows here (seeded by calibration.py, refined every
step), `AdaptiveDrafts` keeps each request's acceptance α (its j-th draft is worth α^j tokens), `best_drafts` feeds
the drafts worth the most tokens per second, a draft model's passes (`PassCost`) counted.
"""
from __future__ import annotations

from collections import Counter, deque

from common.sequence import Sequence

ALPHA_MAX = 0.99  # a request that always matched is still not certain to
EXPLORE_TRIES = 8  # scored drafts before a proposer's acceptance is its own: at the prior one might never be asked
PATIENCE = 16  # lookup drafts past the best count with no better rate: the search stops (64 x 16 slots: a few)


class StepCost:
    """Step seconds as a function of the rows fed, one least-squares line per size class. A line that says rows are
    dear stops the drafts whose rows could refit it: so after ``stale`` steps without drafts at one row count, a class
    forgets its other points (no step confirmed them) and halves its slope through the step it sees, again every
    ``stale`` such steps, until the best drafts are fed: a probe that refits the line. A wrong dear reading (another
    process on a shared machine) ends; a right one costs a probe at times."""

    def __init__(self, window: int = 48, stale: int = 16):
        self.window, self.stale, self.flat = window, stale, Counter()  # flat: class -> steps at one row, no drafts
        self.points: dict[int, deque] = {}  # size class -> its latest (rows, seconds)
        self.lines: dict[int, tuple[float, float]] = {}  # size class -> (a, b), its last fit with a spread of rows

    @staticmethod
    def size_class(base_rows: int) -> int:
        return max(1, base_rows).bit_length() - 1  # 1 -> 0, 2-3 -> 1, 4-7 -> 2, ...

    def observe(self, base_rows: int, rows: int, seconds: float) -> None:
        c = self.size_class(base_rows)
        points = self.points.setdefault(c, deque(maxlen=self.window))
        self.flat[c] = self.flat[c] + 1 if rows == base_rows and points and points[-1][0] == rows else 0
        points.append((rows, seconds))
        if self.flat[c] and self.flat[c] % self.stale == 0 and (line := self.line(base_rows)):  # stale: halve it
            points = self.points[c] = deque((p for p in points if p[0] == rows), maxlen=self.window)
            self.lines[c] = max(min(t for _, t in points) - line[1] / 2 * rows, 1e-6), line[1] / 2
        elif (line := fit(points)) is not None:
            self.lines[c] = line

    def line(self, base_rows: int) -> tuple[float, float] | None:
        """(a, b) of the size class of ``base_rows``, or of the nearest one measured; None before any."""
        c = self.size_class(base_rows)
        return self.lines[min(self.lines, key=lambda x: (abs(x - c), x))] if self.lines else None

    def seconds(self, base_rows: int, rows: int) -> float:
        a, b = self.line(base_rows) or (1.0, 0.0)  # nothing measured yet: rows are free until a step says otherwise
        return a + b * rows


class PassCost:
    """A draft model's pass seconds, t(rows) = a + b * rows, fitted like `StepCost`; nothing measured yet: 0."""

    def __init__(self, window: int = 48):
        self.points, self.ab = deque(maxlen=window), (0.0, 0.0)  # the latest (rows, seconds); (a, b)

    def observe(self, rows: int, seconds: float) -> None:
        self.points.append((rows, seconds))
        self.ab = fit(self.points) or (min(t for _, t in self.points), 0.0)  # one row count: its fastest pass

    def seconds(self, rows: int) -> float:
        return self.ab[0] + self.ab[1] * rows if rows > 0 else 0.0


def fit(points) -> tuple[float, float] | None:
    """Weighted least squares t = a + b * rows (b >= 0, a > 0) through the fastest step at each row count (another
    process only ever adds time). The fastest of n steps errs by about 1/n of one step's noise, so it weighs n²: a
    row count seen once (a noisy moment) barely moves a line that row counts seen often hold. None: rows not spread."""
    w = {r: n * n for r, n in Counter(rows for rows, _ in points).items()}
    fastest, n = {r: min(t for rows, t in points if rows == r) for r in w}, sum(w.values())
    mx, my = sum(r * w[r] for r in w) / n, sum(fastest[r] * w[r] for r in w) / n
    sxx = sum(w[r] * (r - mx) ** 2 for r in w)
    if sxx < 1e-9:
        return None
    b = max(0.0, sum(w[r] * (r - mx) * (fastest[r] - my) for r in w) / sxx)
    return max(my - b * mx, 1e-6), b


def best_drafts(alphas: list[float], lengths: list[int], base_tokens: float, base_rows: int, cost,
                passes: list[PassCost | None] | None = None) -> list[int]:
    """How many of its ``lengths[i]`` proposed drafts each request feeds: the D most valuable draft positions (the
    j-th of request i worth alphas[i] ** j), for the D that maximizes expected tokens per second. ``passes[i]``:
    what its drafts cost (None: a lookup): its j-th draft needs the draft model's j-th pass, priced by its rows."""
    slots = sorted(((min(a, ALPHA_MAX) ** j, -j, i) for i, (a, n) in enumerate(zip(alphas, lengths))
                    for j in range(1, n + 1)), reverse=True)  # ties: earlier positions first (a draft is a prefix)
    passes = passes or [None] * len(lengths)
    in_pass, drafting = Counter(), 0.0  # (draft model, j) -> requests its j-th pass drafts for; the D best's seconds
    tokens, best, best_d = base_tokens, base_tokens / max(cost.seconds(base_rows, base_rows), 1e-12), 0
    for d, (worth, j, i) in enumerate(slots, 1):
        if d > best_d + PATIENCE and not any(passes):  # lookups: the rate rose to its best and only falls now
            break
        tokens += worth
        if passes[i] is not None:  # one more row in the draft's j-th pass (the first of it: the pass itself)
            key = (id(passes[i]), -j)
            drafting += passes[i].seconds(in_pass[key] + 1) - passes[i].seconds(in_pass[key])
            in_pass[key] += 1
        rate = tokens / max(cost.seconds(base_rows, base_rows + d) + drafting, 1e-12)
        if rate > best:
            best, best_d = rate, d
    fed = Counter(i for _, _, i in slots[:best_d])
    return [fed[i] for i in range(len(lengths))]


class AdaptiveDrafts:
    """The policy: each request's acceptance, the step cost, and per step the drafts worth feeding."""

    def __init__(self, cost: StepCost | None = None, prior: float = 0.5, prior_weight: float = 2.0, decay: float = 0.9):
        self.cost = cost or StepCost()
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.own: dict[int, list[float]] = {}  # seq_id -> decayed [drafts kept, drafts tried]
        self.kinds: dict[str, list[float]] = {}  # proposer -> the same over all its requests
        self.pending: dict[int, tuple[Sequence, str, int, list[int]]] = {}  # seq_id -> (seq, kind, length, draft)
        self.counts = Counter()  # draft tokens proposed, and of them fed

    def acceptance(self, seq: Sequence, kind: str) -> float:
        hits, tries = self.kinds.get(kind, (0.0, 0.0))
        prior = (hits + self.prior * self.prior_weight) / (tries + self.prior_weight)
        hits, tries = self.own.get(seq.seq_id, (0.0, 0.0))
        return (hits + prior * self.prior_weight) / (tries + self.prior_weight)

    def choose(self, seqs: list[Sequence], kinds: list[str], drafts: list[list[int]], base_tokens: int,
               base_rows: int, record: bool = True, passes: list[PassCost | None] | None = None) -> list[int]:
        """How many of each request's proposed drafts to feed this step. Every proposal is remembered (``record``), fed
        or not: the tokens the step keeps score it (`score`), so a request not drafting shows what it would keep."""
        alphas = [self.acceptance(s, k) for s, k in zip(seqs, kinds)]
        ks = best_drafts(alphas, [len(d) for d in drafts], base_tokens, base_rows, self.cost, passes)
        for seq, kind, draft, k in zip(seqs, kinds, drafts, ks) if record else ():
            if draft:
                self.pending[seq.seq_id] = (seq, kind, len(seq.token_ids), list(draft))
            self.counts["proposed"] += len(draft)
            self.counts["fed"] += k
        return ks

    def score(self) -> None:
        """After a step: each remembered proposal against the tokens its request kept (i matched: i drafts kept and,
        where the step's tokens reach past them, one more tried and missed)."""
        for seq, kind, length, draft in self.pending.values():
            truth = seq.token_ids[length:]
            hits = next((i for i, (d, t) in enumerate(zip(draft, truth)) if d != t), min(len(draft), len(truth)))
            tries = hits + (hits < min(len(draft), len(truth)))
            for table, key in ((self.own, seq.seq_id), (self.kinds, kind)):
                h, t = table.get(key, (0.0, 0.0))
                table[key] = [h * self.decay + hits, t * self.decay + tries]
        self.pending.clear()

    def exploring(self, kind: str) -> bool:
        """Fewer than EXPLORE_TRIES scored drafts: the scheduler then asks a draft model for one draft a request."""
        return self.kinds.get(kind, (0.0, 0.0))[1] < EXPLORE_TRIES

    def forget(self, seq_ids) -> None:
        for seq_id in seq_ids:
            self.own.pop(seq_id, None)


"""Few long rows spread over the whole GPU: the row graph's `split_row` schedule (issue #14).

When there are fewer rows than about two per SM, one block (or one cluster) per row leaves most SMs
idle. Here each row is cut into kSplit chunks of kChunk columns, one block per chunk. A block takes its
task from a grid-wide ticket (atomicAdd at its start), not from blockIdx. Two forms:

Held (held_split: a thread's share of a chunk fits HOLD_THREAD_FLOATS, and kSplit <= SMs): one phase.
A block loads its chunk into registers once; each round it folds from them, all-reduces across its
threads, publishes its partial, counts itself in, waits until the row's kSplit partials are all
there, and combines them itself (combine_in_every_block: thread t folds partials t, t + kBlock, ...,
then the block's fixed shuffle tree, so every block of the row gets the same bits). The outputs come
from the registers: the row is read once. A block waits only for the chunks of its own row, whose
tickets are next to its own: if every running block waited, the lowest waiting row would still have
an unclaimed chunk, so no later row would have started and fewer than kSplit blocks would be waiting;
with kSplit <= SMs another block can always start. No cooperative launch, no grid barrier.

Streamed (`hold: False`, or a chunk too big to hold): *phases*; phase r - 1 folds round r of the row
graph, the last phase (when the region writes per-element values) evaluates and stores them. Every
phase has kRows * kSplit tasks of one chunk each:

  fold     a block folds its chunk into the round's states, all-reduces them across its threads, and
           publishes them to the workspace; the row's last block to arrive (an atomic ticket per row,
           as codegen/last_block.py) combines the kSplit partials in parallel (as above), stores the
           row's combined state and raises the row's flag for the round;
  output   a block waits for its row's flag, reads the combined states, and writes its chunk.

Every task of phase q has a larger ticket than every task of phase q - 1, so a block only ever waits
for tasks that running blocks have already claimed: the kernel cannot deadlock however many of its
blocks are resident. Each phase walks the tasks in the opposite order to the one before, so it starts
on the chunks that were read last (still in L2). The row is streamed (online states: softmax's max and
sum of exp in one round), so a region that writes per-element values reads its full-size inputs once
per phase; one whose outputs are per-row reads them once.

Either way the last block to finish resets the ticket, the counters and the flags: the kernel leaves
its workspace zeroed for the next launch and for CUDA graph replay. The split factor is a tuning
parameter (`split`); the default comes from the row count, the row length and the SM count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .kernel import CodegenError
from .last_block import publish_and_arrive

SPLIT_ROW_THREADS = 256     # threads per block: 8 blocks fill an SM's 2048 threads
SPLIT_ROW_BLOCKS_PER_SM = 8  # chunks per SM in each phase: enough blocks to keep every SM streaming
SPLIT_ROW_MIN_CHUNK = 4096  # columns per block at least (4 float4 loads per thread): the ticket,
#                             the all-reduce and the workspace round trip stay small beside the loads
HOLD_THREAD_FLOATS = 32     # a held chunk's elements per thread (and input), at most
ROWS_PER_SM = 2             # at this many rows per SM, one block per row already fills the GPU
LOCALS = ("ticket", "task_s", "phase", "task", "lo", "hi", "done", "acc", "flag", "k", "arrived", "last_of_row")


def held_split(cols: int, k: int, parts: int, tpr: int, p: dict) -> int:
    """Chunks per row when each block holds its chunk in registers (0: the row is streamed in phases).
    Held, a block loads its chunk once, folds every round from its registers, combines its row's
    partials after each round and writes its outputs from the same registers: the row is read once.
    More chunks than `parts` where that is what fits HOLD_THREAD_FLOATS a thread (a tuner's `split` is
    kept: streamed if it does not fit). No more chunks per row than SMs: every chunk of a row must be
    running at once, and a block waits only for chunks whose tickets came before its own or are the
    next ones claimed, so the row's last chunks always find an SM (no deadlock however the blocks are
    scheduled). `hold: False` (the tuner's alternative) streams."""
    if not p.get("hold", True):
        return 0
    fit = math.ceil(cols * k / (tpr * HOLD_THREAD_FLOATS))
    n = parts if p.get("split") is not None else max(parts, fit)
    return n if fit <= n <= int(p["sm_count"]) and n <= cols else 0


def row_split(rows: int, cols: int, k: int, p: dict, indexed: bool, streamed: bool) -> int:
    """Chunks per row (1: no split). A tuner's `split` overrides; otherwise fewer rows than half the
    SMs (one block per row leaves most SMs idle; from half of them on, one wave of whole rows beats
    the split's combine phase: H200, 128 rows of 16384 on 132 SMs in 4 chunks ran 0.76x of a block
    per row), or fewer than ROWS_PER_SM per SM when the row is `streamed` (too long for one block's
    registers and a cluster's, or as many rows as SMs: read once per round either way; H200, 128 rows of
    32768 read once: 4 chunks 13.8 us, 8 chunks 15.6, a 2-CTA cluster holding each row 11.5); at least
    spread_min_bytes of full-size inputs (below that the launch dominates) and at least two chunks of
    SPLIT_ROW_MIN_CHUNK columns."""
    sms = int(p["sm_count"])
    if p.get("split") is not None:
        n = int(p["split"])
        if n < 1 or n > cols:
            raise CodegenError(f"split must be 1 to {cols} chunks per row, got {n}")
        if n > 1 and indexed:
            raise CodegenError("argmax / argmin indices do not travel through the split's float workspace; "
                               "use split = 1")
        return n
    enough = ROWS_PER_SM * sms if streamed else sms / 2       # rows that keep the SMs busy without chunks
    if indexed or rows >= enough or rows * cols * k * 4 < int(p["spread_min_bytes"]):
        return 1
    n = min(math.ceil(SPLIT_ROW_BLOCKS_PER_SM * sms / rows), cols // SPLIT_ROW_MIN_CHUNK)
    return n if n >= 2 else 1


@dataclass
class SplitRowSpace:
    """Where everything lives in the workspace: float32 partials and row states per round, the rows'
    shares of the totals; int32 counters: the ticket, the blocks out, the totals' arrivals, then one
    arrival counter and one flag per (round, row)."""
    rows: int
    split: int
    fields: dict[int, int]   # round -> floats of its state
    total_fields: int

    @property
    def rounds(self) -> int:
        return len(self.fields)

    def part_at(self, r: int) -> int:
        return sum(self.rows * (self.split + 1) * self.fields[q] for q in range(1, r))

    def state_at(self, r: int) -> int:
        return self.part_at(r) + self.rows * self.split * self.fields[r]

    @property
    def totals_at(self) -> int:
        return self.part_at(self.rounds + 1)

    @property
    def floats(self) -> int:
        return self.totals_at + self.rows * self.total_fields

    @property
    def ints(self) -> int:
        return 3 + 2 * self.rounds * self.rows

    def consts(self) -> list[str]:
        return ["constexpr unsigned int kTasks = kRows * kSplit;  // chunks of every phase",
                "constexpr int kArriveAt = 3;  // counters: ticket, blocks out, totals' arrivals, then per (round, row)",
                f"constexpr int kFlagAt = kArriveAt + {self.rounds} * kRows;  // a (round, row)'s combined state is ready",
                *[f"constexpr index_t kPartAt{r} = {self.part_at(r)}, kStateAt{r} = {self.state_at(r)};"
                  f"  // round {r}: partials, then combined row states ({self.fields[r]} floats each)"
                  for r in self.fields],
                *([f"constexpr index_t kTotalsAt = {self.totals_at};  // each row's share of the totals"]
                  if self.total_fields else [])]

    def workspace(self) -> list[tuple[str, int]]:
        return [("float32", self.floats), ("int32", self.ints)]


def prelude() -> list[str]:
    return ["  // this block's task: a grid-wide ticket, so a later phase only waits for tasks already running",
            "  __shared__ unsigned int task_s;",
            "  if (threadIdx.x == 0) task_s = atomicAdd(&counters[0], 1u);",
            "  __syncthreads();",
            "  const unsigned int ticket = task_s;",
            "  const int phase = ticket / kTasks;",
            "  // odd phases walk the chunks backwards: they start on what the phase before read last (L2)",
            "  const unsigned int task = (phase & 1) ? kTasks - 1 - ticket % kTasks : ticket % kTasks;",
            "  const index_t row = task / kSplit;",
            "  const int part = task % kSplit;  // which chunk of the row",
            "  const int lane = threadIdx.x;",
            "  const bool active = true;  // the grid is exactly kPhases * kTasks blocks",
            "  const index_t base = row * kCols;",
            "  const int lo = part * kChunk;",
            "  const int hi = min(lo + kChunk, kCols);"]


def _indent(lines: list[str], by: str = "  ") -> list[str]:
    return [by + ln if ln.strip() else ln for ln in lines]


def _publish(r: int, var: str, fields: list[tuple[int, str]]) -> list[str]:
    """The stores of this block's round-r partial into the workspace, at (row, part)."""
    return [f"workspace[kPartAt{r} + (row * kSplit + part) * {len(fields)} + {n}] = {var}.s{j}.{f};"
            for n, (j, f) in enumerate(fields)]


def _combine_partials(r: int, var: str, fields: list[tuple[int, str]]) -> list[str]:
    """The row's kSplit round-r partials combined into `var` by this block: thread t folds partials
    t, t + kBlock, ...; then the block's fixed tree, so the bits do not depend on which block runs it."""
    stride = len(fields)
    return [f"  Round{r} acc = identity{r}();",
            "  for (int k = threadIdx.x; k < kSplit; k += kBlock) {  // thread t: partials t, t + kBlock, ...",
            f"    const float* w = workspace + kPartAt{r} + (row * kSplit + k) * {stride};",
            f"    Round{r} q;",
            *[f"    q.s{j}.{f} = __ldcg(w + {n});" for n, (j, f) in enumerate(fields)],
            f"    acc = combine{r}(acc, q);",
            "  }",
            f"  {var} = reduce{r}(acc);  // the block's fixed tree"]


def fold_and_combine(r: int, var: str, fields: list[tuple[int, str]], fold: list[str], final: list[str],
                     keep_state: bool) -> list[str]:
    """Phase r - 1: fold the chunk (`fold` ends with the block's all-reduce into `var`), publish it;
    the row's last block combines the kSplit partials in parallel, then runs `final` (every thread) and
    stores the combined state and raises the row's flag where a later phase reads them."""
    stride = len(fields)
    store = [f"workspace[kStateAt{r} + row * {stride} + {n}] = {var}.s{j}.{f};" for n, (j, f) in enumerate(fields)]
    out = [*fold,
           f"  // publish this block's round-{r} partial; the row's last block combines all kSplit of them",
           *publish_and_arrive(_publish(r, var, fields), f"counters[kArriveAt + {r - 1} * kRows + row]", "kSplit"),
           "  if (last) {",
           "    __threadfence();",
           *_indent(_combine_partials(r, var, fields)),
           *_indent(final, "  "),
           "    if (threadIdx.x == 0) {",
           f"      counters[kArriveAt + {r - 1} * kRows + row] = 0u;  // ready for the next launch"]
    if keep_state:
        out += [*[f"      {ln}" for ln in store],
                "      __threadfence();",
                f"      atomicExch(&counters[kFlagAt + {r - 1} * kRows + row], 1u);  // round {r} of this row is ready"]
    return out + ["    }", "  }"]


def wait_and_load(r: int, var: str, fields: list[tuple[int, str]]) -> list[str]:
    """A later phase: wait for the row's round-r flag (raised by a block already running), read the
    combined state."""
    stride = len(fields)
    return ["  if (threadIdx.x == 0) {",
            f"    const volatile unsigned int* flag = counters + kFlagAt + {r - 1} * kRows + row;",
            "    while (*flag == 0u) __nanosleep(64);",
            "    __threadfence();",
            "  }",
            "  __syncthreads();",
            *[f"  {var}.s{j}.{f} = __ldcg(workspace + kStateAt{r} + row * {stride} + {n});"
              for n, (j, f) in enumerate(fields)]]


def nest(rounds: int, fold: dict[int, list[str]], loaded: dict[int, list[str]], output: list[str]) -> list[str]:
    """The phases as nested branches: phase r - 1 folds round r; every later phase first loads round
    r's combined state (`loaded[r]`: the wait, the load and the round's per-row values)."""
    def level(r: int) -> list[str]:
        if r == rounds and not output:
            return fold[r]
        later = level(r + 1) if r < rounds else output
        return [f"  if (phase == {r - 1}) {{", *_indent(fold[r]), "  } else {", *_indent(loaded[r]),
                *_indent(later), "  }"]
    return level(1)


def combine_in_every_block(r: int, var: str, fields: list[tuple[int, str]], fold: list[str],
                           note_last: bool) -> list[str]:
    """A held chunk's round r: fold it (`fold` ends with the block's all-reduce into `var`), publish
    it, wait until every chunk of the row has, then combine the kSplit partials in this block (thread
    t: partials t, t + kBlock, ...; then the block's fixed tree: the same bits in every block of the
    row). No block combines for the others: a row's blocks go on as soon as its last partial lands,
    not after a combining block has stored the state and raised a flag. `note_last`: keep whether this
    block arrived last in `last_of_row` (it writes the per-row results)."""
    counter = f"counters[kArriveAt + {r - 1} * kRows + row]"
    arrive = f"atomicAdd(&{counter}, 1u)"
    return [*fold,
            f"  // publish this block's round-{r} partial, wait for the row's other chunks, combine all kSplit",
            *(["  __shared__ bool last;"] if note_last else []),
            "  if (threadIdx.x == 0) {",
            *_indent(_publish(r, var, fields), "    "),
            "    __threadfence();",
            f"    {'last = ' + arrive + ' == kSplit - 1' if note_last else arrive};",
            f"    const volatile unsigned int* arrived = &{counter};",
            "    while (*arrived < kSplit) __nanosleep(32);",
            "    __threadfence();",
            "  }",
            "  __syncthreads();",
            *(["  last_of_row = last;"] if note_last else []),
            *_combine_partials(r, var, fields)]


def in_turn(rounds: int, fold: dict[int, list[str]], defs: dict[int, list[str]], final: list[str],
            output: list[str]) -> list[str]:
    """A held chunk's one phase: each round folds from the registers and combines the row's partials
    (combine_in_every_block), then its per-row values; the block that arrived last in the last round
    runs `final` (the per-row outputs, the totals' share); the outputs come from the registers."""
    out = ["  bool last_of_row;  // this block's partial completed its row: it writes the per-row results"] \
        if final else []
    for r in range(1, rounds + 1):
        out += ["  {  // round %d" % r, *_indent(fold[r]), "  }", *defs[r]]
    if final:
        out += ["  if (last_of_row) {", *_indent(final), "  }"]
    return out + output


def count_out() -> list[str]:
    """Every block counts out; the last resets the ticket and the flags for the next launch."""
    return ["  // every block counts out; the last to finish resets the ticket, the row arrivals and flags",
            "  __shared__ bool done;",
            "  __syncthreads();",
            "  if (threadIdx.x == 0) {",
            "    __threadfence();",
            "    done = atomicAdd(&counters[1], 1u) == gridDim.x - 1;",
            "  }",
            "  __syncthreads();",
            "  if (done) {",
            "    for (int k = threadIdx.x; k < 2 * (kFlagAt - kArriveAt); k += kBlock) counters[kArriveAt + k] = 0u;",
            "    if (threadIdx.x == 0) { counters[0] = 0u; counters[1] = 0u; }",
            "  }"]


def tune_variants(params: dict, *, sm_count: int = 132) -> list[dict]:
    """A split row's alternatives (agent/tune.py): twice and half the chunks per row (streamed where
    half no longer fits a held chunk), none (one block or cluster per row, the row read once), a held
    row's chunks streamed in phases, and a held row's other rounds where the online and two-stage
    graphs differ (rowkernel._held_online)."""
    s, cols = int(params["split"]), int(params.get("cols") or 0)
    out = [{"split": c} for c in (s * 2, s // 2) if 2 <= c <= cols] + [{"split": 1}]
    if params.get("cached"):
        out.append({"hold": False})
    if params.get("other_rounds"):
        out.append({"held_online": not params.get("online")})
    return [{**o, "sm_count": sm_count} for o in out]

"""Settings for one GPU: KV-cache format, context length, prefill chunk, where the embedding table lives,
and how many agents may share the GPU. ``choose_settings`` is a pure function of the card's figures.

The policy, in the order it decides (the memory figures come from ``memory.MemoryModel``):

1. Refusals first: compute capability below 8.0 (the kernels use sm_80 instructions); several agents on
   a GPU with fewer than ``AGENTS_MIN_SMS`` SMs (the shared weight read pays off only when the extra
   rows find idle SMs: below that a step with two agents takes as long as two steps); a card whose total
   memory cannot hold the smallest setup (weights with the embedding table in host memory, q4_0 KV for
   ``MIN_CTX`` tokens, a 512-token chunk): the 16 GB cards; less free memory than that smallest setup
   (other programs hold the rest).
2. Target context per agent: the requested one, else ``DEFAULT_TARGET_CTX`` (131072, a coding agent's
   working set) divided among the agents, halving down to ``MIN_CTX`` only when nothing fits.
3. For the target: prefill chunk 2048, then 1024, then 512 (memory short); within a chunk size the most
   precise KV format whose cache holds the target: fp16, else q8_0, else q4_0 (``KV_FORMATS`` order).
   Where the dense prefill GEMM runs (compute capability 9.0), a chunk of ``DENSE_CHUNK`` (4096) instead of 2048
   when that costs no context: the model's whole context still fits.
   A requested KV format is the only one tried.
4. Context: the requested one, else the target grown to everything that fits in that format, up to the
   model's 262144, rounded down to ``CTX_STEP``.
5. The embedding table (0.67 GiB on 27B) stays on the GPU unless that would cost context; in host memory it
   costs one 2.8 KiB row read over PCIe per prompt token.

A requested context or KV format that does not fit is refused with what would fit on this GPU.

The policy is applied within what the engine that will run can do (``EngineLimits``): ``CUDA_V1``, the engine
in native/ today, keeps its KV cache as fp16 or q8_0, holds the embedding table on the GPU and one sequence;
``PLANNED`` is the design's engine (q4_0 KV, the table in host memory, up to 8 agents). The launcher, doctor
and the presets table use CUDA_V1, so the context they choose is one the engine can allocate.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

from ..errors import OpenJetError
from ..model.shape import QWEN38_27B, ModelShape
from .memory import KV_FORMATS, GiB, MemoryModel, MemoryPlan, MiB, memory_model

DEFAULT_TARGET_CTX = 131072
MIN_CTX = 32768          # less is not worth serving an agent with: refuse instead
CTX_STEP = 4096          # grown contexts are rounded down to this
CHUNKS = (2048, 1024, 512)
# Where the dense prefill GEMM runs (compute capability 9.0, the release wheels' sm_90a code), a chunk of this many
# rows dequantises every weight half as often as 2,048: the 27B's prefill on the H200 at 4,096 tokens 7,316 ->
# 8,014 tok/s, at 32,768 6,139 -> 6,543 (8,192 rows: 7,966 and 6,550; bench/results/engine-full-h200-8bfa2d6-rows-
# *.json). The other cards' fast kernel gains nothing from it (4,556 -> 4,522 tok/s at 4,096 on the same H200).
DENSE_CHUNK = 4096
AGENTS_MIN_SMS = 80
MAX_AGENTS = 8           # DECODE_ROWS x MAX_AGENTS rows is the largest verify batch the engine plans for
MIN_COMPUTE_CAPABILITY = (8, 0)
CPU_PATH = "openjet-launch --engine reference --model demo"


@dataclass(frozen=True)
class EngineLimits:
    """What the engine that will serve can do, as far as the settings are concerned."""
    name: str
    kv_formats: tuple[str, ...]    # the KV cache formats it keeps, most precise first
    embd_on_host: bool             # it can read the token-embedding table from host memory
    max_agents: int                # sequences it holds at once
    v1_arena: bool = False         # its memory is engine v1's own allocation (MemoryModel.engine_v1_arena)


PLANNED = EngineLimits("the planned engine", tuple(KV_FORMATS), True, MAX_AGENTS)
CUDA_V1 = EngineLimits("the CUDA engine v1", ("fp16", "q8_0"), False, 1, True)   # native/src/engine.cu


@dataclass(frozen=True)
class Settings:
    kv_format: str
    n_ctx: int                 # tokens per agent
    n_agents: int
    prefill_chunk: int         # prompt tokens per prefill step
    embd_on_host: bool         # token_embd.weight in pinned host memory
    agents_allowed: bool       # sm_count >= AGENTS_MIN_SMS
    max_ctx: int               # most tokens per agent these settings leave room for (capped at the model's)
    memory: MemoryPlan
    reasons: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"kv_format": self.kv_format, "n_ctx": self.n_ctx, "n_agents": self.n_agents,
                "prefill_chunk": self.prefill_chunk, "embd_on_host": self.embd_on_host,
                "agents_allowed": self.agents_allowed, "max_ctx": self.max_ctx,
                "memory": self.memory.to_dict(), "reasons": list(self.reasons)}


def parse_compute_capability(cc: str | float | int | tuple[int, int]) -> tuple[int, int]:
    """"8.6", 8.6, 86 or (8, 6) -> (8, 6)."""
    if isinstance(cc, tuple):
        return int(cc[0]), int(cc[1])
    if isinstance(cc, int):
        return divmod(cc, 10) if cc >= 10 else (cc, 0)
    major, _, minor = str(cc).partition(".")
    return int(major), int(minor or 0)


def _cc_argument(text: str) -> str:
    """--cc as argparse checks it: MAJOR.MINOR ("8.6", "12.0"), else a usage error naming the value."""
    import argparse
    import re

    if not re.fullmatch(r"\d{1,2}(\.\d)?", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a compute capability such as 8.6 or 12.0")
    return text.strip()


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


MAX_CTX = 262144  # the CUDA engine's limit (engine.cu check_config), whatever context a file declares


def _cap(mm: MemoryModel, n: int) -> int:
    return min(n, mm.shape.n_ctx_train, MAX_CTX)


def _rounded(mm: MemoryModel, n: int) -> int:
    """A grown context rounded down to CTX_STEP; a model trained on less than that keeps its own (not 0)."""
    n = _cap(mm, n)
    return n // CTX_STEP * CTX_STEP if n >= CTX_STEP else n


def what_fits(mm: MemoryModel, free_vram: int, total_vram: int, n_agents: int,
              engine: EngineLimits = CUDA_V1, sm_count: int | None = None,
              dense_prefill: bool = False) -> dict[str, int]:
    """The most tokens per agent each of the engine's KV formats allows (smallest chunk, the embedding table
    in host memory where the engine can read it there)."""
    return {fmt: _cap(mm, mm.max_ctx(free_vram=free_vram, total_vram=total_vram, kv_format=fmt,
                                     chunk=CHUNKS[-1], n_agents=n_agents, embd_on_host=engine.embd_on_host,
                                     v1_arena=engine.v1_arena, sm_count=sm_count, dense_prefill=dense_prefill))
            for fmt in engine.kv_formats}


def _fits_text(fits: dict[str, int], n_agents: int) -> str:
    per = " per agent" if n_agents > 1 else ""
    parts = [f"{fmt} up to {n} tokens" for fmt, n in fits.items() if n > 0]
    return (", ".join(parts) + per) if parts else "nothing"


def least_ctx(model: ModelShape = QWEN38_27B, requested_ctx: int | None = None) -> int:
    """The smallest context worth serving: MIN_CTX, or less where the model was trained on less or the user asked
    for less (a context the user names is theirs to choose)."""
    return min(MIN_CTX, model.n_ctx_train, requested_ctx or MIN_CTX)


def model_words(model: ModelShape) -> str:
    """How messages name the model the plan is for."""
    same = (model.n_layer, model.n_embd, model.n_vocab) == (QWEN38_27B.n_layer, QWEN38_27B.n_embd, QWEN38_27B.n_vocab)
    return "Qwen3.8-27B" if same else "this model"


def smallest_plan(total_vram: int, model: ModelShape = QWEN38_27B, engine: EngineLimits = CUDA_V1,
                  requested_ctx: int | None = None) -> MemoryPlan:
    """The least memory the engine runs in: its most compact KV format for least_ctx tokens, 1 agent, the
    smallest chunk, the embedding table in host memory if it can read it there. A card below this is refused."""
    return memory_model(model).plan(n_ctx=least_ctx(model, requested_ctx), kv_format=engine.kv_formats[-1],
                                    chunk=CHUNKS[-1], n_agents=1, embd_on_host=engine.embd_on_host,
                                    total_vram=total_vram, v1_arena=engine.v1_arena)


def choose_settings(total_vram: int, free_vram: int | None, sm_count: int,
                    compute_capability: str | float | int | tuple[int, int],
                    requested_ctx: int | None = None, requested_agents: int = 1,
                    model: ModelShape = QWEN38_27B, requested_kv: str | None = None,
                    engine: EngineLimits = CUDA_V1) -> Settings:
    """The settings for a GPU with these figures (bytes, SMs, "8.6") within what `engine` can do;
    OpenJetError saying why when none."""
    mm = memory_model(model)
    free = total_vram if free_vram is None else min(free_vram, total_vram)
    cc = parse_compute_capability(compute_capability)
    # The release wheels' sm_90a code prefills through the dense GEMM, whose scratch the engine then holds.
    dense = engine.v1_arena and cc == (9, 0)
    agents = requested_agents
    agents_allowed = sm_count >= AGENTS_MIN_SMS and engine.max_agents > 1

    if cc < MIN_COMPUTE_CAPABILITY:
        raise OpenJetError(f"compute capability {cc[0]}.{cc[1]} is too old: the engine's kernels need 8.0 or "
                           f"newer (RTX 30xx, A10, L4, RTX 40xx/50xx, H100/H200). CPU path: {CPU_PATH}")
    if requested_kv is not None and requested_kv not in KV_FORMATS:
        raise OpenJetError(f"unknown KV format {requested_kv!r}: choose one of {', '.join(KV_FORMATS)}")
    if requested_kv is not None and requested_kv not in engine.kv_formats:
        raise OpenJetError(f"KV format {requested_kv}: {engine.name} keeps its KV cache as "
                           f"{' or '.join(engine.kv_formats)}")
    if not 1 <= agents <= MAX_AGENTS:
        raise OpenJetError(f"{agents} agents requested: OpenJet serves 1 to {MAX_AGENTS} agents on one GPU")
    if agents > engine.max_agents:
        raise OpenJetError(f"{agents} agents requested: {engine.name} holds {engine.max_agents} sequence"
                           f"{'s' if engine.max_agents > 1 else ''} at a time")
    if agents > 1 and not agents_allowed:
        raise OpenJetError(f"{agents} agents need a GPU with at least {AGENTS_MIN_SMS} SMs, this one has "
                           f"{sm_count}: agents share one weight read per step only where the extra rows "
                           "find idle SMs. This GPU serves 1 agent.")
    if requested_ctx is not None and not 1 <= requested_ctx <= min(model.n_ctx_train, MAX_CTX):
        raise OpenJetError(f"context {requested_ctx}: the model takes 1 to {min(model.n_ctx_train, MAX_CTX)} tokens")

    floor = least_ctx(model, requested_ctx)
    smallest = smallest_plan(total_vram, model, engine, requested_ctx)
    if smallest.total > total_vram:
        where = "embedding table in host memory" if engine.embd_on_host else "embedding table included"
        raise OpenJetError(
            f"this GPU has {gib(total_vram)}, too little for {model_words(model)}: the weights alone take "
            f"{gib(smallest.weights)} ({where}), and the smallest setup ({floor} tokens of "
            f"{engine.kv_formats[-1]} KV, 512-token prefill chunks, CUDA context, safety margin) needs "
            f"{gib(smallest.total)}. Cards with 24 GB or more run it. Without one: {CPU_PATH}")
    if smallest.total > free:
        raise OpenJetError(
            f"only {gib(free)} of this GPU's {gib(total_vram)} is free; OpenJet needs at least "
            f"{gib(smallest.total)}. Other programs hold {gib(total_vram - free)}: close them "
            "(`nvidia-smi` lists them) and try again.")

    def room(fmt: str, chunk: int, on_host: bool) -> int:
        return mm.max_ctx(free_vram=free, total_vram=total_vram, kv_format=fmt, chunk=chunk,
                          n_agents=agents, embd_on_host=on_host and engine.embd_on_host, v1_arena=engine.v1_arena,
                          sm_count=sm_count, dense_prefill=dense)

    formats = [requested_kv] if requested_kv else list(engine.kv_formats)
    if requested_ctx is not None:
        targets = [requested_ctx]
    else:
        targets, t = [], min(max(MIN_CTX, DEFAULT_TARGET_CTX // agents), model.n_ctx_train, MAX_CTX)
        while t >= floor:
            targets.append(t)
            t //= 2
    choice = next(((t, c, f) for t in targets for c in CHUNKS for f in formats if room(f, c, True) >= t), None)
    if choice is None:
        fits = what_fits(mm, free, total_vram, agents, engine, sm_count, dense)
        asked = (f"{requested_ctx} tokens" if requested_ctx else f"{floor} tokens (the minimum)")
        asked += f" of {requested_kv} KV" if requested_kv else ""
        asked += f" for each of {agents} agents" if agents > 1 else ""
        raise OpenJetError(f"{asked} do not fit in this GPU's {gib(free)} of free memory. What fits: "
                           f"{_fits_text(fits, agents)}.")

    target, chunk, fmt = choice
    big_chunk = dense and chunk == CHUNKS[0] and _cap(mm, room(fmt, DENSE_CHUNK, False)) == _cap(mm, MAX_CTX)
    if big_chunk:
        chunk = DENSE_CHUNK
    reasons = []
    if requested_ctx is not None:
        n_ctx = requested_ctx
        on_host = engine.embd_on_host and room(fmt, chunk, False) < n_ctx
        reasons.append(f"context {n_ctx}: requested")
    else:
        grown = _rounded(mm, room(fmt, chunk, True))
        grown_on_gpu = _rounded(mm, room(fmt, chunk, False))
        on_host = engine.embd_on_host and grown_on_gpu < grown
        n_ctx = grown
        reasons.append(f"context {n_ctx}: target {target}, grown to what fits (model maximum "
                       f"{model.n_ctx_train})")
    more_precise = formats[:formats.index(fmt)]
    reasons.append(f"KV {fmt}: requested" if requested_kv else
                   f"KV {fmt}: the most precise format holding {target} tokens"
                   + (f" ({', '.join(more_precise)} would not)" if more_precise else ""))
    reasons.append(f"prefill chunk {chunk}" + (": the dense prefill GEMM dequantises each weight once a chunk, and "
                                               "the model's whole context fits with it" if big_chunk else
                                               "" if chunk == CHUNKS[0] else ": memory is short"))
    reasons.append("embedding table in host memory: on the GPU it would cost context" if on_host else
                   "embedding table on the GPU")
    if not agents_allowed:
        reasons.append(f"1 agent: {sm_count} SMs < {AGENTS_MIN_SMS}" if sm_count < AGENTS_MIN_SMS else
                       f"1 agent: {engine.name} holds one sequence")
    if engine is not PLANNED:
        reasons.append(f"within what {engine.name} does: KV {' or '.join(engine.kv_formats)}, "
                       + ("embedding table in host memory allowed" if engine.embd_on_host else
                          "embedding table on the GPU") + f", {engine.max_agents} sequence(s)")
    plan = mm.plan(n_ctx=n_ctx, kv_format=fmt, chunk=chunk, n_agents=agents, embd_on_host=on_host,
                   total_vram=total_vram, v1_arena=engine.v1_arena, sm_count=sm_count, dense_prefill=dense)
    return Settings(kv_format=fmt, n_ctx=n_ctx, n_agents=agents, prefill_chunk=chunk, embd_on_host=on_host,
                    agents_allowed=agents_allowed, max_ctx=_cap(mm, room(fmt, chunk, on_host)), memory=plan,
                    reasons=tuple(reasons))


# --- the table of known cards ------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    name: str
    total_mib: int        # as nvidia-smi / NVML report it (less than the marketing "24 GB" on some)
    sm_count: int
    compute_capability: str
    desktop: bool         # GeForce: a display and a desktop session usually hold some memory

    @property
    def total_vram(self) -> int:
        return self.total_mib * MiB

    @property
    def free_vram(self) -> int:
        """Assumed free memory: a desktop holds about 1 GiB, a headless datacenter card about 0.25 GiB."""
        return self.total_vram - (GiB if self.desktop else GiB // 4)


CARDS: tuple[Card, ...] = (
    Card("RTX 3090", 24576, 82, "8.6", True),
    Card("RTX 4090", 24564, 128, "8.9", True),
    Card("RTX 5090", 32607, 170, "12.0", True),
    Card("A10", 23028, 72, "8.6", False),
    Card("L4", 23034, 58, "8.9", False),
    Card("H100 80GB", 81559, 132, "9.0", False),
    Card("H200", 143771, 132, "9.0", False),
    Card("RTX 4080 16GB", 16376, 76, "8.9", True),
)


def table_rows(cards: tuple[Card, ...] = CARDS, requested_ctx: int | None = None, requested_agents: int = 1,
               requested_kv: str | None = None, model: ModelShape = QWEN38_27B,
               engine: EngineLimits = CUDA_V1) -> list[dict]:
    rows = []
    for card in cards:
        row = {"gpu": card.name, "total_vram": card.total_vram, "free_vram": card.free_vram,
               "sm_count": card.sm_count, "compute_capability": card.compute_capability}
        try:
            s = choose_settings(card.total_vram, card.free_vram, card.sm_count, card.compute_capability,
                                requested_ctx=requested_ctx, requested_agents=requested_agents,
                                model=model, requested_kv=requested_kv, engine=engine)
            row["settings"] = s.to_dict()
        except OpenJetError as e:
            row["refused"] = str(e)
        rows.append(row)
    return rows


def format_table(rows: list[dict], engine: EngineLimits = CUDA_V1) -> str:
    head = f"{'GPU':<14} {'VRAM':>9} {'free':>9} {'SMs':>4} {'CC':>4}  {'KV':<5} {'context':>7} {'chunk':>5} " \
           f"{'embd':<4} {'agents':<6} {'KV cache':>9} {'scratch':>9} {'total':>9}"
    lines = [head, "-" * len(head)]
    refusals = []
    for r in rows:
        left = f"{r['gpu']:<14} {gib(r['total_vram']):>9} {gib(r['free_vram']):>9} {r['sm_count']:>4} " \
               f"{r['compute_capability']:>4}  "
        if "refused" in r:
            refusals.append(f"{r['gpu']}: {r['refused']}")
            lines.append(left + f"refused [{len(refusals)}]")
            continue
        s = r["settings"]
        agents = f"1-{MAX_AGENTS}" if s["agents_allowed"] else "1"
        lines.append(left + f"{s['kv_format']:<5} {s['n_ctx']:>7} {s['prefill_chunk']:>5} "
                            f"{'host' if s['embd_on_host'] else 'gpu':<4} {agents:<6} "
                            f"{gib(s['memory']['kv_cache']):>9} "
                            f"{gib(s['memory']['prefill_scratch'] + s['memory']['decode_workspace'] + s['memory']['draft_rows']):>9} "
                            f"{gib(s['memory']['total']):>9}")
    lines.append("")
    lines.append(f"for {engine.name}: KV {' or '.join(engine.kv_formats)}, embedding table "
                 + ("in host memory where that gives context" if engine.embd_on_host else "on the GPU")
                 + f", {engine.max_agents} sequence(s)" + ("" if engine is PLANNED else " (--planned: the design's engine)"))
    lines.append("free: assumed (a desktop holds ~1 GiB, a datacenter card ~0.25 GiB); `openjet-launch doctor` "
                 "uses this machine's figures.")
    lines.append(f"embd: where the token-embedding table lives; agents: how many may share the GPU (context "
                 f"shown for 1; fewer than {AGENTS_MIN_SMS} SMs: 1).")
    lines.append("scratch: the prefill chunk's activations and the decode step's workspace (logits, attention "
                 "partials, top-k, verification's shadow state, the MTP head's draft rows); total: everything the plan holds, CUDA context and "
                 "safety margin included.")
    lines += [f"[{i}] {text}" for i, text in enumerate(refusals, 1)]
    return "\n".join(lines)


def _cmd_presets(args: argparse.Namespace) -> int:
    cards = CARDS
    if args.vram is not None and not 0 < args.vram < 1 << 20:  # also refuses nan and inf
        raise OpenJetError(f"--vram {args.vram}: give the card's memory in GiB, e.g. --vram 24")
    if args.vram is not None:
        cards = (Card("this card", int(args.vram * 1024), args.sms, args.cc, False),) if args.only else \
            CARDS + (Card("this card", int(args.vram * 1024), args.sms, args.cc, False),)
    engine = PLANNED if args.planned else CUDA_V1
    rows = table_rows(cards, requested_ctx=args.ctx, requested_agents=args.agents, requested_kv=args.kv,
                      engine=engine)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows, engine))
    return 0


def add_presets_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "presets", help="the settings OpenJet picks on common GPUs (KV format, context, chunk)",
        description="Print the settings choose_settings picks for common GPUs (or for a card described with "
                    "--vram/--sms/--cc): KV cache format, context per agent, prefill chunk, where the embedding "
                    "table lives, agents; and why a card is refused. Policy: most precise KV format (fp16, q8_0, "
                    "q4_0) that holds the target context (131072 unless --ctx), context grown to what fits up to "
                    "262144, prefill chunk 2048 unless memory is short.")
    p.add_argument("--ctx", type=int, default=None, help="requested context per agent (tokens)")
    p.add_argument("--agents", type=int, default=1, help="agents sharing the GPU (default 1)")
    p.add_argument("--kv", choices=list(KV_FORMATS), default=None, help="requested KV cache format")
    p.add_argument("--vram", type=float, default=None, metavar="MIB_DIV_1024",
                   help="add a card with this much memory in GiB (with --sms and --cc)")
    p.add_argument("--sms", type=int, default=82, help="SM count of the --vram card (default 82)")
    p.add_argument("--cc", default="8.6", type=_cc_argument,
                   help="compute capability of the --vram card (default 8.6)")
    p.add_argument("--only", action="store_true", help="with --vram: print that card alone")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--planned", action="store_true",
                   help="the settings of the planned engine (q4_0 KV, embedding table in host memory, agents) "
                        "instead of the CUDA engine v1's")
    p.set_defaults(func=_cmd_presets)
    return p

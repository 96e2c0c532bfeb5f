"""Held-out judgement: ten programs unlike record_phases.sh's six, each as an ML engineer writes it, each
with what an expert would say of it (EXPECT below: the story, where it ran out, what filled the GPU, and
the remedies that must NOT be given: a wrong remedy costs a user more than silence). Run on a GPU by
tests/gpu/judgement.sh:
    python3 judgement.py NAME           # one program (prints one JSON line at the end: what it did)
    python3 judgement.py check DIR      # the verdicts in DIR/NAME.report.json against EXPECT: ok/BAD lines
Every program sizes its memory from torch.cuda.mem_get_info, so it behaves alike on 80 and 141 GB, and runs
in under 40 s on an H100.
accum_graphs     gradient accumulation written as `total = total + loss / accum` with one backward at the
                 end: every micro-batch's graph waits for it, and the first step runs out in a forward
adam_first_step  a wide model with a small batch whose first optimizer.step() runs out: Adam's state
                 (allocated lazily, twice the parameters) does not fit beside parameters and gradients
kv_generate      greedy generation under torch.no_grad() with a KV cache grown by torch.cat each token:
                 the cache fills the GPU (it is already in no_grad: inference_mode is no remedy)
slow_load        a checkpoint loaded shard by shard for ~25 s (a slow file system), then a few inference
                 batches: a load, not a leak (judgement.sh runs it with --stop-on steady-growth)
logits_kept      training that keeps every step's logits (and loss) in lists for epoch-end metrics,
                 without .detach().cpu(): a step leak, no OOM
ckpt_train       training with torch.utils.checkpoint (use_reentrant=False), healthy: no diagnosis, and
                 its result bit for bit what it is without gpudoc
varlen_frag      an embedding job under no_grad over batches of varying length that keeps every other
                 batch's outputs in a memory bank: the cache is split into holes, and the longest batch
                 fails with half the cache reserved but unallocated (fragmentation)
eval_then_train  training with one large no_grad evaluation in the middle: PyTorch's cache stays far
                 above the live tensors afterwards, healthy (no leak)
oom_retry        a batch-size finder: it catches its OOM, halves the batch and trains on (exit 0)
prefetch_stream  training fed by a side-stream prefetcher from pinned host memory (record_stream), healthy"""
import json
import os
import re
import sys
import time

GiB = 1 << 30
MiB = 1 << 20


def cuda():
    import torch
    return torch, torch.device("cuda:0")


def free_total():
    torch, dev = cuda()
    torch.cuda.init()
    return torch.cuda.mem_get_info(dev)


def mlp(width, depth, dev):
    import torch
    layers = []
    with dev:  # made on the GPU: no seconds of initialisation on the CPU
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def accum_graphs(width=4096, depth=4, accum=32):
    """Gradient accumulation over `accum` micro-batches, written so one backward sees them all: each
    micro-batch's forward keeps ~1/16 of the GPU for that backward, so the 16th or so runs out."""
    torch, dev = cuda()
    model = mlp(width, depth, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    free, _ = free_total()
    # A forward keeps ~2 activations of (batch, width) per layer (Linear's input, GELU's input).
    micro = max(256, free // 16 // (2 * depth * width * 4) // 256 * 256)
    done = 0
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(accum):
            x = torch.randn(micro, width, device=dev)
            loss = model(x).pow(2).mean()
            total = total + loss / accum
            torch.cuda.synchronize()
            time.sleep(0.05)  # the next micro-batch is loaded
        total.backward()
        opt.step()
        done += 1
    return {"micro": micro, "steps": done}


def adam_first_step(width=8192, batch=64):
    """A wide model whose parameters take a fifth of the GPU: parameters, then gradients (a fifth more),
    then Adam's exp_avg and exp_avg_sq (two fifths) and the foreach update's temporaries do not fit."""
    torch, dev = cuda()
    free, _ = free_total()
    per_layer = width * width * 4
    depth = max(2, int(free * 0.22) // per_layer)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width, bias=False, device=dev) for _ in range(depth)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=dev)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        torch.cuda.synchronize()
        time.sleep(0.5)
        opt.step()
    return {"depth": depth}


def kv_generate(heads=32, head_dim=128, layers=8, batch=64):
    """A decoder's greedy generation under torch.no_grad() after model.eval(), its KV cache grown by
    torch.cat each token (as a hand-written cache does): each token adds ~1/200 of the GPU to it."""
    torch, dev = cuda()
    width = heads * head_dim

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(width, 3 * width, dtype=torch.bfloat16)
            self.out = torch.nn.Linear(width, width, dtype=torch.bfloat16)

        def forward(self, x, cache):
            q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, heads, head_dim).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            if cache is not None:
                k = torch.cat([cache[0], k], dim=2)
                v = torch.cat([cache[1], v], dim=2)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return x + self.out(y.transpose(1, 2).reshape(x.shape)), (k, v)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32000, width, dtype=torch.bfloat16)
            self.layers = torch.nn.ModuleList([Layer() for _ in range(layers)])
            self.head = torch.nn.Linear(width, 32000, dtype=torch.bfloat16)

        def forward(self, ids, past):
            x = self.embed(ids)
            new = []
            for layer, cache in zip(self.layers, past):
                x, kv = layer(x, cache)
                new.append(kv)
            return self.head(x[:, -1]), new

    free, _ = free_total()
    per_token = 2 * layers * batch * width * 2  # K and V, bfloat16
    batch = max(1, int(batch * (free / 200) / per_token))  # ~1/200 of the GPU a token
    with dev:
        model = Decoder().eval()
    ids = torch.randint(0, 32000, (batch, 16), device=dev)
    past = [None] * layers
    made = 0
    with torch.no_grad():
        logits, past = model(ids, past)
        for _ in range(4096):
            nxt = logits.argmax(-1, keepdim=True)
            logits, past = model(nxt, past)
            made += 1
            torch.cuda.synchronize()
            time.sleep(0.03)
    return {"batch": batch, "tokens": made}


def slow_load(shards=24, per_shard_s=1.0):
    """A model of ~40% of the GPU loaded from a slow file system: each shard is read on the CPU (a second),
    then its layers are moved to the GPU; then 5 s of inference batches."""
    torch, dev = cuda()
    free, total = free_total()
    width = 8192
    per_layer = width * width * 2  # bfloat16
    layers_per_shard = max(1, int(total * 0.4) // shards // per_layer)
    model = torch.nn.ModuleList()
    for _ in range(shards):
        time.sleep(per_shard_s)  # the shard is read
        for _ in range(layers_per_shard):
            # Read into host memory (not initialised: the checkpoint's bytes would overwrite it).
            layer = torch.nn.utils.skip_init(torch.nn.Linear, width, width, bias=False, dtype=torch.bfloat16)
            model.append(layer.to(dev))
        torch.cuda.synchronize()
    model.eval()
    t0 = time.time()
    batches = 0
    with torch.inference_mode():
        while time.time() - t0 < 5:
            x = torch.randn(256, width, device=dev, dtype=torch.bfloat16)
            for layer in model:
                x = torch.nn.functional.gelu(layer(x))
            torch.cuda.synchronize()
            batches += 1
            time.sleep(0.05)
    return {"layers": len(model), "batches": batches}


def logits_kept(width=4096, vocab=32000, steps=80):
    """A language-model head trained with metrics computed at the epoch's end from every step's logits and
    loss, kept in lists as they came: each step keeps its logits on the GPU (~1/250 of it)."""
    torch, dev = cuda()
    free, _ = free_total()
    batch = max(64, free // 250 // (vocab * 4) // 64 * 64)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    all_logits, all_labels, losses = [], [], []
    for _ in range(steps):
        x = torch.randn(batch, width, device=dev)
        y = torch.randint(0, vocab, (batch,), device=dev)
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        all_logits.append(logits)
        all_labels.append(y)
        losses.append(loss)
        torch.cuda.synchronize()
        time.sleep(0.05)
    acc = float((torch.cat(all_logits).argmax(-1) == torch.cat(all_labels)).float().mean())
    return {"batch": batch, "acc": acc, "loss": float(torch.stack(losses).mean())}


def ckpt_train(width=2048, depth=6, steps=60):
    """Training whose blocks are recomputed in backward (torch.utils.checkpoint, use_reentrant=False).
    Deterministic: the result is the same bits with and without gpudoc."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic
    torch, dev = cuda()
    import torch.utils.checkpoint as ckpt
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    blocks = torch.nn.ModuleList(
        [torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
         for _ in range(depth)]).to(dev)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4)
    gen = torch.Generator(device=dev).manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(2048, width, device=dev, generator=gen)
        opt.zero_grad(set_to_none=True)
        for b in blocks:
            x = x + ckpt.checkpoint(b, x, use_reentrant=False)
        loss = x.pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        time.sleep(0.02)
    digest = float(sum(float(p.double().sum()) for p in blocks.parameters()))
    return {"loss": losses[-1].hex(), "params": digest.hex()}


def varlen_frag(width=4096):
    """Embeddings of batches of varying length under no_grad, every other batch's outputs kept in a
    memory bank (hard examples), then the longest batch. The first, long, batch leaves one segment of ~80%
    of the GPU cached; the following outputs split it end to end, and the bank keeps every other one: the
    cache is holes between kept outputs (frag.py's mechanism, as a program would come to it)."""
    torch, dev = cuda()
    free0, total = free_total()
    piece = 200 * MiB
    rows = piece // (width * 4)
    seg = int(free0 * 0.8) // (2 * piece) * (2 * piece)
    proj = torch.nn.Linear(width, width).to(dev).eval()
    bank = []
    with torch.no_grad():
        warm = torch.empty(seg, dtype=torch.uint8, device=dev)  # the long first batch's buffer
        del warm
        outs = []
        for i in range(seg // piece):
            outs.append(torch.empty(rows, width, device=dev))  # a batch's embeddings
            if i % 2 == 0:
                bank.append(outs[-1])
        del outs
        torch.cuda.synchronize()
        time.sleep(1.0)
        free, _ = torch.cuda.mem_get_info(dev)
        want = free + min(seg // 4, total // 16)
        long_rows = want // (width * 4) + 1
        x = torch.empty(long_rows, width, device=dev)  # the longest batch
        y = proj(x[:1])
    return {"bank": len(bank), "out": float(y.float().sum())}


def eval_then_train(width=8192, depth=4):
    """40 training steps with a small batch, one evaluation under no_grad with a batch 16 times larger
    (its activations need ~25% of the GPU once), then 40 more training steps. Healthy."""
    torch, dev = cuda()
    free, _ = free_total()
    model = mlp(width, depth, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(1024, width, device=dev)
    ebatch = max(4096, int(free * 0.25) // (3 * width * 4) // 1024 * 1024)

    def steps(n):
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
            torch.cuda.synchronize()
            time.sleep(0.05)

    steps(40)
    model.eval()
    with torch.no_grad():
        score = float(model(torch.randn(ebatch, width, device=dev)).mean())
    model.train()
    steps(40)
    return {"ebatch": ebatch, "score": score}


def oom_retry(width=1024, depth=8, steps=10):
    """A batch-size finder: start at a batch whose forward needs twice the GPU, catch the OOM, empty the
    cache, halve the batch, and train `steps` steps (TF32) at the first batch that fits."""
    torch, dev = cuda()
    torch.backends.cuda.matmul.allow_tf32 = True
    free, _ = free_total()
    model = mlp(width, depth, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = int(2 * free // (2 * depth * width * 4)) // 1024 * 1024
    tried = []
    while batch >= 256:
        try:
            x = torch.randn(batch, width, device=dev)
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                model(x).pow(2).mean().backward()
                opt.step()
                torch.cuda.synchronize()
                time.sleep(0.02)
            break
        except torch.OutOfMemoryError:
            tried.append(batch)
            x = None
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            batch //= 2
            print(f"out of memory at batch {tried[-1]}, trying {batch}", file=sys.stderr, flush=True)
    return {"tried": tried, "batch": batch}


def prefetch_stream(width=4096, steps=150):
    """Training fed by a prefetcher: batches made in pinned host memory, copied on a side stream, handed to
    the compute stream with wait_stream and record_stream. Healthy."""
    torch, dev = cuda()
    model = mlp(width, 4, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream(dev)
    host = [torch.randn(2048, width).pin_memory() for _ in range(4)]

    def fetch(i):
        with torch.cuda.stream(side):
            return host[i % len(host)].to(dev, non_blocking=True)

    nxt = fetch(0)
    for i in range(steps):
        torch.cuda.current_stream(dev).wait_stream(side)
        x = nxt
        x.record_stream(torch.cuda.current_stream(dev))
        nxt = fetch(i + 1)
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        time.sleep(0.01)
    torch.cuda.synchronize()
    return {"steps": steps}


PROGRAMS = {f.__name__: f for f in (accum_graphs, adam_first_step, kv_generate, slow_load, logits_kept,
                                     ckpt_train, varlen_frag, eval_then_train, oom_retry, prefetch_stream)}

# What an expert would say of each program. `exit`: the run's classification; `code`: its exit code;
# `rules`: rules that must fire; `loud_ok`: rules beside them that may fire at warn or error (any other is
# a false diagnosis);
# `facts`: an OOM story's facts (oom.*) and the values they must have (a tuple: any of them); `say`:
# patterns its story (message and details, of the rule named first in `rules`) must hold; `never`:
# remedies that must not be given (patterns no diagnosis's advice may hold); `never_said`: patterns no
# diagnosis's title, message or details may hold; `stopped`: whether gpudoc ended it (--stop-on);
# `no_error`: no diagnosis at error; `advice`: patterns the story's advice must hold; `same_as_bare`: its
# result (last JSON line) is the bare run's; `why`: what an expert says, printed above its lines.
EXPECT_KEYS = {"exit", "code", "stopped", "rules", "loud_ok", "no_error", "facts", "say", "advice", "never",
               "never_said", "same_as_bare", "why"}
TRAINING_ONLY = r"inference_mode|no_grad"  # a forward that a backward follows: neither is a remedy
RECOMPUTE = r"checkpointing|utils\.checkpoint"  # activation checkpointing (not a checkpoint file)
EXPECT = {
    "accum_graphs": {
        "exit": "gpu_oom", "rules": ["oom-self-growth"],
        "facts": {"oom.phase": "training_step", "oom.pass": "forward", "oom.largest_part": "activations"},
        "say": [r"graph", r"`total`"],
        "never": [TRAINING_ONLY], "never_said": [r"\bevaluation\b", r"validation"],
        "why": "every micro-batch's graph waits for one backward: call backward per micro-batch, "
               "never inference_mode (its forward is for a backward)"},
    "adam_first_step": {
        "exit": "gpu_oom", "rules": ["oom-self-growth"],
        "facts": {"oom.phase": "training_step", "oom.pass": "optimizer", "oom.steps": 0,
                  "oom.largest_part": "optimizer_state"},
        "say": [r"optimizer"],
        "never": [TRAINING_ONLY, RECOMPUTE, r"batch", r"autocast|mixed precision"],
        "why": "Adam's state (2x the parameters) does not fit: a smaller optimizer state (8-bit, sharded, "
               "SGD, bf16 weights); batch size, activation checkpointing and autocast change nothing"},
    "kv_generate": {
        "exit": "gpu_oom", "rules": ["oom-self-growth"],
        "facts": {"oom.phase": "inference"},
        # The cache does keep what each token makes: steady-growth may say so, with a remedy of a cache's.
        "loud_ok": ["near-capacity", "steady-growth"],
        "say": [r"\bpast\b"],
        "never": [r"inference_mode|torch\.no_grad", RECOMPUTE, r"optimizer|gradient"],
        "never_said": [r"\btraining step\b"],
        "why": "the KV cache (`past`) grows with every token: fewer tokens or sequences, a preallocated "
               "or paged cache; it already runs under no_grad, so inference_mode is no remedy"},
    "slow_load": {
        "exit": "success", "code": 0, "stopped": False, "rules": [], "loud_ok": [],
        "never_said": [r"\bleak", r"grows steadily"],
        "why": "a slow load is not a leak: no steady-growth, and --stop-on steady-growth must not end it"},
    "logits_kept": {
        "exit": "success", "rules": ["step-leak"], "loud_ok": [],
        "say": [r"all_logits"],
        "never": [TRAINING_ONLY], "never_said": [r"exp_avg|optimizer state"],
        "why": "every step's logits stay in `all_logits`: keep logits.detach().cpu() (or the argmax) "
               "and loss.item(); the training itself needs its graphs"},
    "ckpt_train": {
        "exit": "success", "code": 0, "rules": [], "loud_ok": [], "same_as_bare": True,
        "why": "activation checkpointing, healthy: nothing to say, and the same result bits as bare"},
    "varlen_frag": {
        "exit": "gpu_oom", "rules": ["oom-fragmentation"],
        "facts": {"oom.cause": "fragmentation"},
        "advice": [r"expandable_segments"],
        "never": [r"inference_mode|no_grad", RECOMPUTE, r"gradient"],
        "why": "half the cache is holes between the bank's tensors: expandable_segments, "
               "not a smaller model"},
    "eval_then_train": {
        "exit": "success", "code": 0, "rules": [],
        "loud_ok": ["cache-bloat", "phase-peak", "transient-spike"],
        "never_said": [r"\bleak", r"grows steadily"],
        "why": "the cache stays above the live tensors after one large evaluation: no leak"},
    "oom_retry": {
        "exit": "success", "code": 0, "rules": [],
        "loud_ok": ["near-capacity", "phase-peak", "transient-spike", "cache-bloat", "allocator-thrash"],
        "no_error": True, "never_said": [r"the job ran out of memory", r"the job died"],
        "why": "the program caught its OOMs and trained on at a smaller batch: it did not die"},
    "prefetch_stream": {
        "exit": "success", "code": 0, "rules": [], "loud_ok": [],
        "why": "a side-stream prefetcher from pinned memory, healthy: nothing to say"},
}


def last_json(path):
    """The program's own last JSON line (what it did), or None."""
    try:
        lines = [x for x in open(path).read().splitlines() if x.startswith("{")]
    except OSError:
        return None
    return json.loads(lines[-1]) if lines else None


def texts(d, keys):
    out = []
    for k in keys:
        v = d.get(k)
        out += v if isinstance(v, list) else [v] if isinstance(v, str) else []
    return out


def judge(name, report, stdout=None, bare=None, expect=None):
    """(ok, what) for each expectation of program `name` (in `expect`, EXPECT by default) against its
    report."""
    want = (EXPECT if expect is None else expect)[name]
    unknown = sorted(set(want) - EXPECT_KEYS)
    if unknown:  # a misspelt key would check nothing
        raise ValueError(f"{name}: unknown expectation key(s) {', '.join(unknown)}")
    diags = report.get("diagnoses") or []
    fired = {d["rule"] for d in diags}
    loud = {d["rule"] for d in diags if d["severity"] in ("warn", "error")}
    ex = report.get("exit") or {}
    got = f"got {ex.get('classification')}, code {ex.get('code')}"
    out = [(ex.get("classification") == want["exit"], f"exit is {want['exit']} ({got})")]
    if "code" in want:
        out.append((ex.get("code") == want["code"], f"exit code {want['code']} (got {ex.get('code')})"))
    if "stopped" in want:
        out.append((bool(ex.get("killed_by_gpudoc")) == want["stopped"],
                    f"{'ended' if want['stopped'] else 'not ended'} by gpudoc (killed_by_gpudoc "
                    f"{ex.get('killed_by_gpudoc')})"))
    for r in want["rules"]:
        out.append((r in fired, f"{r} fires (fired: {','.join(sorted(fired)) or '-'})"))
    # A job that ran out nearly filled its GPU: near-capacity is then true; elsewhere only where allowed.
    allowed = set(want["rules"]) | set(want.get("loud_ok", ["near-capacity"]))
    extra = loud - allowed
    out.append((not extra, f"no other warn/error diagnosis (extra: {','.join(sorted(extra)) or '-'})"))
    if want.get("no_error"):
        errs = sorted(d["rule"] for d in diags if d["severity"] == "error")
        out.append((not errs, f"no error diagnosis (got: {','.join(errs) or '-'})"))
    story = next((d for d in diags if want["rules"] and d["rule"] == want["rules"][0]), None)
    facts = (story or {}).get("facts") or {}
    for k, v in (want.get("facts") or {}).items():
        vs = v if isinstance(v, tuple) else (v,)
        out.append((facts.get(k) in vs, f"{k} is {' or '.join(map(str, vs))} (got {facts.get(k)})"))
    told = " ".join(texts(story or {}, ("title", "message", "details")))
    for pat in want.get("say", []):
        out.append((bool(re.search(pat, told)), f"its story says /{pat}/"))
    advice = " ".join(texts(story or {}, ("advice",)))
    for pat in want.get("advice", []):
        out.append((bool(re.search(pat, advice)), f"its advice says /{pat}/"))
    for pat in want.get("never", []):
        bad = [a for d in diags for a in texts(d, ("advice",)) if re.search(pat, a)]
        out.append((not bad, f"no advice /{pat}/" + (f" (given: {bad[0][:160]!r})" if bad else "")))
    for pat in want.get("never_said", []):
        bad = [(d["rule"], t) for d in diags for t in texts(d, ("title", "message", "details"))
               if re.search(pat, t)]
        said = f" ({bad[0][0]}: {bad[0][1][:160]!r})" if bad else ""
        out.append((not bad, f"nothing says /{pat}/{said}"))
    if want.get("same_as_bare"):
        out.append((stdout is not None and stdout == bare,
                    f"its result is the bare run's (gpudoc {stdout}, bare {bare})"))
    return out


def check(folder, expect=None):
    """Prints an ok or BAD line per expectation of each program of `expect` (EXPECT by default: another
    set's table, such as judgement2.py's) recorded in `folder`, then the count; exits 1 if any is BAD or
    missing."""
    expect = EXPECT if expect is None else expect
    n_ok = n_bad = 0
    for name in expect:
        path = os.path.join(folder, name + ".report.json")
        if not os.path.exists(path):
            print(f"BAD {name}: no report")
            n_bad += 1
            continue
        report = json.load(open(path))
        stdout = last_json(os.path.join(folder, name + ".stdout"))
        bare = last_json(os.path.join(folder, name + ".bare.stdout"))
        print(f"--- {name}: {expect[name]['why']}")
        for ok, what in judge(name, report, stdout, bare, expect):
            print(f"{'ok ' if ok else 'BAD'} {name}: {what}")
            n_ok += ok
            n_bad += not ok
        for d in report.get("diagnoses") or []:
            print(f"      {d['severity']:5} {d['rule']}: {d['message'][:400]}")
            for line in (d.get("details") or [])[:3]:
                print(f"        {line[:300]}")
            for line in (d.get("advice") or [])[:4]:
                print(f"        advice: {line[:200]}")
    print(f"judgement: {n_ok} ok, {n_bad} BAD")
    return 1 if n_bad else 0


def main(argv, programs, expect):
    """`check DIR` (the verdicts in DIR against `expect`) or `NAME` (run one of `programs`, then print one
    JSON line: what it did)."""
    if argv[1] == "check":
        sys.exit(check(argv[2], expect))
    if argv[1] not in programs:
        sys.exit("unknown program " + argv[1])
    result = programs[argv[1]]()
    print(json.dumps({"what": argv[1], **result}), flush=True)


if __name__ == "__main__":
    main(sys.argv, PROGRAMS, EXPECT)

"""The tensor cores' rate at the 27B's prefill shapes, from torch (cuBLAS / cuBLASLt), as the ceiling a
dequantise-then-GEMM prefill could reach: fp16 x fp16 -> fp16 (fp32 accumulation), int8 x int8 -> int32
(torch._int_mm) and fp8 e4m3 (torch._scaled_mm), plus the cost of writing the fp16 weights once.
Prints one JSON object. Needs torch with CUDA (the GPU machine has it; it is not a dependency of the package)."""
import json
import torch

SHAPES = [  # (name, n_out, k) per 27B layer kind, 2,048 token rows
    ("ffn_gate_up", 2 * 17408, 5120), ("ffn_down", 5120, 17408), ("gdn_in_proj", 10240 + 6144 + 96, 5120),
    ("gdn_out", 5120, 6144), ("attn_qkv", 12288 + 2048, 5120), ("attn_out", 5120, 6144)]


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record(); fn(); end.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda, "rows": {}}
    for m in (2048, 4096):
        for name, n, k in SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            w = torch.randn(n, k, device="cuda", dtype=torch.float16)
            flop = 2 * m * n * k
            r = {}
            us = timed(lambda: a @ w.t())
            r["fp16_us"], r["fp16_tflops"] = round(us, 1), round(flop / us / 1e6, 1)
            us = timed(lambda: w.clone())
            r["write_w_fp16_us"] = round(us, 1)
            try:
                a8 = torch.randint(-100, 100, (m, k), device="cuda", dtype=torch.int8)
                w8 = torch.randint(-100, 100, (n, k), device="cuda", dtype=torch.int8)
                us = timed(lambda: torch._int_mm(a8, w8.t()))
                r["int8_us"], r["int8_tops"] = round(us, 1), round(flop / us / 1e6, 1)
            except Exception as e:  # noqa: BLE001 - a missing kernel is a result too
                r["int8_error"] = str(e)[:200]
            try:
                af = a.to(torch.float8_e4m3fn); wf = w.to(torch.float8_e4m3fn)
                one = torch.ones((), device="cuda")
                us = timed(lambda: torch._scaled_mm(af, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.float16))
                r["fp8_us"], r["fp8_tflops"] = round(us, 1), round(flop / us / 1e6, 1)
            except Exception as e:  # noqa: BLE001
                r["fp8_error"] = str(e)[:200]
            out["rows"][f"{name} m={m} n={n} k={k}"] = r
            print(name, m, r, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

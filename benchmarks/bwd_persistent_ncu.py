"""ncu counters of the fused backward: one-program-per-block build vs the persistent build (one-off)."""
import os, subprocess, sys, shutil
if len(sys.argv) > 1 and sys.argv[1] == "child":
    import torch
    from kernelops import flash_attention
    from kernelops.kernels.flash_attention import bwd_fused
    causal, S, variant = sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
    D, H = 128, 16
    B = 16384 // S
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = flash_attention(q, k, v, return_lse=True, causal=causal)
    dout = torch.randn_like(out)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    blocks = S // 128
    units = B * H * blocks
    bwd_fused.num_sms = lambda device, default=1: units
    for _ in range(3):
        bwd_fused.flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5,
                                            causal=causal, persistent=variant == "pers_all")
    torch.cuda.synchronize()
    sys.exit(0)
METRICS = ",".join([
    "gpu__time_duration.sum", "sm__cycles_active.avg", "smsp__inst_executed.sum",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "lts__t_bytes.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_misc_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio",
])
ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
for causal, S in ((False, 16384), (True, 512)):
    for variant in ("per_block", "pers_all"):
        run = subprocess.run([ncu, "--clock-control", "none", "--kernel-name", "regex:bwd_fused", "--launch-skip", "2",
                              "--launch-count", "1", "--metrics", METRICS, "--csv", sys.executable, __file__, "child",
                              str(int(causal)), str(S), variant], capture_output=True, text=True)
        print(f"== causal={causal} S={S} {variant} rc={run.returncode}")
        for line in run.stdout.splitlines():
            if line.startswith('"') and "Metric Name" not in line:
                f = [x.strip('"') for x in line.split('","')]
                print(f"{f[-3]:85s} {f[-2]:8s} {f[-1]}")
        if run.returncode:
            print(run.stderr[-2000:])

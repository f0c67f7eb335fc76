"""bench/decode_step_profile.py picks a benchmark's decode steps out of a kernel timeline
(bench/kernel_trace.cpp's CSV) or an Nsight Compute log, and adds up each kernel's time, the
idle gaps before its launches and its DRAM traffic, per step."""
import json
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "bench" / "decode_step_profile.py"
TIMELINE_HEADER = '"Start (ns)","Duration (ns)","GrdX","GrdY","GrdZ","Strm","Name"\n'


def summarize(path, *args):
    done = subprocess.run([sys.executable, str(SCRIPT), str(path), *args], capture_output=True, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines()]


def timeline(rows):
    """rows: (start ns, duration ns, grid x, name), or (start, duration, None, name) for a copy."""
    lines = [TIMELINE_HEADER]
    for start, duration, grid, name in rows:
        grid_cols = f"{grid},1,1" if grid is not None else ",,"
        lines.append(f'{start},{duration},{grid_cols},7,"{name}"\n')
    return "".join(lines)


def decode_step(t, batch, gemv_ns, gap_ns):
    """A decode step from time t: a gap, a GEMV, attention, then sampling; its rows and end."""
    rows = [(t + gap_ns, gemv_ns, 384, "void hsx::cuda::GemvKernel<__nv_bfloat16>(const __nv_bfloat16 *)"),
            (t + gap_ns + gemv_ns, 5000, 33, "void hsx::cuda::(anonymous namespace)::DecodeKernel<128>(AttentionArgs)"),
            (t + gap_ns + gemv_ns + 5000, 1000, None, "[memcpy HtoD 52 bytes]"),
            (t + gap_ns + gemv_ns + 6000, 3000, batch, "hsx::cuda::<unnamed>::SampleKernel(const float *)")]
    return rows, t + gap_ns + gemv_ns + 9000


def test_timeline_averages_the_benchmarks_decode_steps(tmp_path):
    rows = [(0, 1000, 8, "hsx::cuda::<unnamed>::SampleKernel(const float *)"),
            # a prefill step: not a decode step, whatever its sampling grid
            (2000, 90000, 132, "hsx::cuda::<unnamed>::HopperKernel(AttentionArgs, Schedule)"),
            (92000, 1000, 4, "hsx::cuda::<unnamed>::SampleKernel(const float *)")]
    t = 93000
    for batch, gemv_ns, gap_ns in [(4, 20000, 700), (4, 18000, 500), (4, 16000, 300), (2, 50000, 100)]:
        step, t = decode_step(t, batch, gemv_ns, gap_ns)
        rows += step
    (tmp_path / "trace.csv").write_text(timeline(rows))
    lines = summarize(tmp_path / "trace.csv", "--steps", "2", "--layers", "1")
    by_kernel = {line["kernel"]: line for line in lines if "kernel" in line}
    # the last two steps of batch 4 (the usual sampling grid), not the batch-2 one after them
    gemv = by_kernel["GemvKernel<__nv_bfloat16>"]
    assert gemv["us_per_step"] == 17.0 and gemv["launches_per_step"] == 1.0
    assert gemv["gap_us_per_step"] == 0.4  # (500 + 300) / 2 ns: the gaps after each step's sampling
    assert by_kernel["DecodeKernel<128>"]["gap_us_per_step"] == 0.0
    assert by_kernel["SampleKernel"]["gap_us_per_step"] == 1.0  # the copy before it is idle time to the kernels
    assert gemv["advance_us_per_step"] == 17.4  # its gap and duration: nothing overlaps here
    assert by_kernel["SampleKernel"]["advance_us_per_step"] == 4.0  # the copy before it, and itself
    assert lines[-1] == {"steps": 2, "kernels_per_step": 3.0, "kernel_us_per_step": 25.0, "gap_us_per_step": 1.4,
                         "wall_us_per_step": 26.4}


def test_overlapping_kernels_share_the_steps_wall_time_by_advance(tmp_path):
    """A programmatically launched kernel starts before the one before it ends: its duration
    overlaps, and only how far it moves the latest end counts as its share of the step."""
    rows, t = [(0, 1000, 4, "hsx::cuda::<unnamed>::SampleKernel(const float *)")], 1000
    for _ in range(2):
        rows += [(t + 100, 10_000, 384, "void hsx::cuda::GemvKernel<__nv_bfloat16>(const __nv_bfloat16 *)"),
                 (t + 6100, 7000, 33, "void hsx::cuda::(anonymous namespace)::DecodeKernel<128>(AttentionArgs)"),
                 (t + 13_100, 2000, 4, "hsx::cuda::<unnamed>::SampleKernel(const float *)")]
        t += 15_100
    (tmp_path / "trace.csv").write_text(timeline(rows))
    lines = summarize(tmp_path / "trace.csv", "--steps", "2")
    by_kernel = {line["kernel"]: line for line in lines if "kernel" in line}
    assert by_kernel["DecodeKernel<128>"]["us_per_step"] == 7.0
    assert by_kernel["DecodeKernel<128>"]["gap_us_per_step"] == -4.0
    assert by_kernel["DecodeKernel<128>"]["advance_us_per_step"] == 3.0
    assert by_kernel["GemvKernel<__nv_bfloat16>"]["advance_us_per_step"] == 10.1
    assert lines[-1]["kernel_us_per_step"] == 19.0 and lines[-1]["wall_us_per_step"] == 15.1


def test_ncu_log_gives_times_and_bandwidth(tmp_path):
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
              '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')
    metrics = []
    kernels = [("SampleKernel(const float *)", "(8, 1, 1)", 3000, 0),
               ("void hsx::cuda::(anonymous namespace)::DecodeKernel<128>(AttentionArgs)", "(33, 8, 1)", 6000, 2_200_000),
               ("void hsx::<unnamed>::GemvKernel<__nv_bfloat16>(const __nv_bfloat16 *)", "(384, 1, 1)", 16_800, 50_400_000),
               ("SampleKernel(const float *)", "(8, 1, 1)", 3000, 0)]
    for i, (name, grid, ns, dram) in enumerate(kernels):
        prefix = f'"{i}","1","hsx","h","{name}","1","7","(256, 1, 1)","{grid}","0","9.0","Command line profiler metrics"'
        metrics.append(f'{prefix},"gpu__time_duration.sum","ns","{ns:,}"\n')
        metrics.append(f'{prefix},"dram__bytes_read.sum","byte","{dram:,}"\n')
        metrics.append(f'{prefix},"dram__bytes_write.sum","byte","0"\n')
    (tmp_path / "ncu.csv").write_text("==PROF== Connected to process 1\n" + header + "".join(metrics))
    lines = summarize(tmp_path / "ncu.csv")
    by_kernel = {line["kernel"]: line for line in lines if "kernel" in line}
    assert by_kernel["GemvKernel<__nv_bfloat16>"]["tb_per_s"] == 3.0  # 50.4 MB in 16.8 us
    assert by_kernel["DecodeKernel<128>"]["us_per_step"] == 6.0
    assert lines[-1]["kernel_us_per_step"] == 25.8 and lines[-1]["gb_per_step"] == 0.053


def test_a_kernel_of_several_grids_is_an_entry_a_grid_ordered_by_advance(tmp_path):
    """The GEMVs of a layer's projections are one kernel with different grids: each grid is
    its own entry, and a timeline's entries come most wall time first."""
    gemv = "void hsx::cuda::GemvKernel<__nv_bfloat16>(const __nv_bfloat16 *)"
    rows, t = [(0, 1000, 4, "hsx::cuda::<unnamed>::SampleKernel(const float *)")], 1000
    for _ in range(2):
        rows += [(t, 4000, 384, gemv),
                 (t + 4000, 3000, 33, "void hsx::cuda::(anonymous namespace)::DecodeKernel<128>(AttentionArgs)"),
                 (t + 7000, 9000, 256, gemv),
                 (t + 16_000, 2000, 4, "hsx::cuda::<unnamed>::SampleKernel(const float *)")]
        t += 18_000
    (tmp_path / "trace.csv").write_text(timeline(rows))
    lines = summarize(tmp_path / "trace.csv", "--steps", "2")
    names = [line["kernel"] for line in lines if "kernel" in line]
    assert names == ["GemvKernel<__nv_bfloat16> (256, 1, 1)", "GemvKernel<__nv_bfloat16> (384, 1, 1)",
                     "DecodeKernel<128>", "SampleKernel"]
    assert lines[0]["advance_us_per_step"] == 9.0 and lines[1]["advance_us_per_step"] == 4.0

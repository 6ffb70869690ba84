"""Compiles the kernels listed in DIR/manifest.tsv with NVRTC and ptxas; see cuda-compile.sh.

Each kernel is compiled as cubecl-cuda 0.10 compiles it at run time (its compile_kernel):
NVRTC with --gpu-architecture=sm_{arch} (sm_{arch}a from 90 on), the CUDA include path and
-lineinfo; the PTX then goes through `ptxas -v` for the same architecture, which reports the
registers per thread, the static shared memory and the spill bytes. The occupancy is that of
the CUDA occupancy calculator for the kernel's cube size, its registers and its shared memory
(static + the dynamic bytes cubecl passes at launch + the 1 KB the driver reserves per block).
"""

import concurrent.futures
import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import nvidia.cuda_nvcc
import nvidia.cuda_nvrtc
import nvidia.cuda_runtime

# Per SM of each architecture's flagship (H100 SXM for sm_90, A100 for sm_80): registers,
# threads, resident blocks, shared memory (bytes), and the bytes the driver keeps per block.
SM = {
    90: dict(registers=65536, threads=2048, blocks=32, shared=228 * 1024, reserved=1024),
    80: dict(registers=65536, threads=2048, blocks=32, shared=164 * 1024, reserved=1024),
}
# Registers are given to warps in units of 256.
REGISTER_UNIT = 256
# Below this occupancy, or with any spill, a kernel is flagged for a look.
LOW_OCCUPANCY = 0.25


def package_dir(module):
    return Path(list(module.__path__)[0])


NVRTC_LIB = next((package_dir(nvidia.cuda_nvrtc) / "lib").glob("libnvrtc.so*"))
PTXAS = package_dir(nvidia.cuda_nvcc) / "bin" / "ptxas"
INCLUDE = package_dir(nvidia.cuda_runtime) / "include"

nvrtc = ctypes.CDLL(str(NVRTC_LIB))
nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p


def nvrtc_compile(source, arch):
    """Returns (ptx, None) or (None, the compiler's log)."""
    program = ctypes.c_void_p()
    status = nvrtc.nvrtcCreateProgram(
        ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None
    )
    if status != 0:
        return None, "nvrtcCreateProgram: " + nvrtc.nvrtcGetErrorString(status).decode()
    target = f"--gpu-architecture=sm_{arch}a" if arch >= 90 else f"--gpu-architecture=sm_{arch}"
    options = [target.encode(), f"--include-path={INCLUDE}".encode(), b"-lineinfo"]
    array = (ctypes.c_char_p * len(options))(*options)
    try:
        status = nvrtc.nvrtcCompileProgram(program, len(options), array)
        if status != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(program, log)
            return None, log.value.decode(errors="replace")
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetPTX(program, ptx)
        return ptx.value.decode(), None
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def ptxas(ptx_path, arch):
    """Registers, static shared memory and spill bytes, or the assembler's error."""
    target = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    run = subprocess.run(
        [str(PTXAS), "-v", f"-arch={target}", "-o", os.devnull, str(ptx_path)],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        return None, run.stderr.strip()
    out = run.stderr
    number = lambda pattern: sum(int(m) for m in re.findall(pattern, out))
    return (
        dict(
            registers=max([int(m) for m in re.findall(r"Used (\d+) registers", out)] or [0]),
            smem=number(r"(\d+) bytes smem"),
            spill_stores=number(r"(\d+) bytes spill stores"),
            spill_loads=number(r"(\d+) bytes spill loads"),
            stack=number(r"(\d+) bytes stack frame"),
        ),
        None,
    )


def occupancy(arch, threads, registers, shared):
    """Resident warps per SM over the maximum, and what limits them."""
    sm = SM[arch]
    warps = -(-threads // 32)
    limits = {"threads": sm["threads"] // (warps * 32), "blocks": sm["blocks"]}
    per_warp = -(-max(registers, 1) * 32 // REGISTER_UNIT) * REGISTER_UNIT
    limits["registers"] = (sm["registers"] // per_warp) // warps
    limits["shared memory"] = sm["shared"] // (shared + sm["reserved"])
    blocks = min(limits.values())
    limit = min(limits, key=limits.get)
    return blocks * warps / (sm["threads"] // 32), limit


def compile_one(root, row):
    arch = int(row["arch"])
    path = root / row["file"]
    if path.suffix == ".error":
        return dict(row, error="cubecl could not write CUDA: " + path.read_text()[:2000])
    ptx, log = nvrtc_compile(path.read_text(), arch)
    if ptx is None:
        return dict(row, error="NVRTC: " + log)
    ptx_path = path.with_suffix(".ptx")
    ptx_path.write_text(ptx)
    stats, err = ptxas(ptx_path, arch)
    if stats is None:
        return dict(row, error="ptxas: " + err)
    shared = stats["smem"] + int(row["dynamic_shared_bytes"])
    occ, limit = occupancy(arch, int(row["threads"]), stats["registers"], shared)
    return dict(row, **stats, occupancy=occ, limit=limit)


def report(results):
    lines = [
        "| arch | kernel | origin | launched by | cube | registers | smem static + dynamic (B) "
        "| spills st/ld (B) | occupancy | limited by | look |",
        "|---|---|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(
                f"| sm_{r['arch']} | `{r['kernel']}` | {r['origin']} | {r['launched_by']} | "
                f"{r['cube_dim']} | | | | | | **fails to compile** |"
            )
            continue
        flags = []
        if r["spill_stores"] or r["spill_loads"]:
            flags.append("spills")
        if r["occupancy"] < LOW_OCCUPANCY:
            flags.append("occupancy < 25 %")
        lines.append(
            f"| sm_{r['arch']} | `{r['kernel']}` | {r['origin']} | {r['launched_by']} | "
            f"{r['cube_dim']} | {r['registers']} | {r['smem']} + {r['dynamic_shared_bytes']} | "
            f"{r['spill_stores']}/{r['spill_loads']} | {100 * r['occupancy']:.0f} % | "
            f"{r['limit']} | {', '.join(flags)} |"
        )
    return "\n".join(lines)


def main():
    root = Path(sys.argv[1])
    rows = (root / "manifest.tsv").read_text().splitlines()
    header = rows[0].split("\t")
    rows = [dict(zip(header, line.split("\t"))) for line in rows[1:] if line]
    jobs = int(os.environ.get("JOBS", os.cpu_count() or 1))
    print(f"compiling {len(rows)} kernels with NVRTC ({NVRTC_LIB.name}) and ptxas", file=sys.stderr)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda row: compile_one(root, row), rows))
    table = report(results)
    failed = [r for r in results if "error" in r]
    flagged = [
        r for r in results
        if "error" not in r and (r["spill_stores"] or r["spill_loads"] or r["occupancy"] < LOW_OCCUPANCY)
    ]
    summary = (
        f"\n{len(results) - len(failed)} of {len(results)} kernels compile; "
        f"{len(flagged)} spill or run below {LOW_OCCUPANCY:.0%} occupancy."
    )
    (root / "report.md").write_text(table + "\n" + summary + "\n")
    print(table)
    print(summary)
    for r in failed:
        print(f"\nerror: sm_{r['arch']} {r['file']} ({r['kernel']}, {r['launched_by']}):\n{r['error']}",
              file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

# shellcheck shell=bash
# Sourced by scripts/gpu_first_run.sh and tools/gpu/timing_runs.sh. cuDNN opens its engine
# libraries and NVRTC at run time (issue 25, B5), so an `attention: "cudnn"` run needs every pip
# nvidia/*/lib of the machine's PyTorch on LD_LIBRARY_PATH; they go after what is there (their
# sonames are CUDA 12's: the CUDA install's libraries stay first).
add_nvidia_lib_path() {  # add_nvidia_lib_path PYTHON
  local nv d
  for nv in $("$1" -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null); do
    for d in "$nv"/*/lib; do
      [ -d "$d" ] || continue
      case ":${LD_LIBRARY_PATH:-}:" in
        *":$d:"*) ;;
        *) export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d" ;;
      esac
    done
  done
}

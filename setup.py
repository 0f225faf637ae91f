"""Package layout: `packed_ss/` plus the Triton kernels in `kernels/`, installed as `packed_ss.kernels`, and
the native step epilogue `packed_ss._epilogue` built from `csrc/` by CMake (CMakeLists.txt).

The native module is optional: without CMake or a C++ compiler the install still succeeds (with a warning)
and the engine uses the torch epilogue. With nvcc (on PATH, in $CUDACXX or /usr/local/cuda/bin) the
module also carries the CUDA kernels for sm_80 and sm_90; if that part fails to compile, the CPU part is
built alone. Environment:
  PACKED_SS_NATIVE=0           skip the native build
  PACKED_SS_REQUIRE_NATIVE=1   fail the install if the CPU module, or the CUDA part when nvcc exists, fails
  PACKED_SS_CUDA=0             CPU module only, even with nvcc
  PACKED_SS_CUDA_ARCHS="80;90" CUDA architectures (CMake syntax)
  PACKED_SS_BUILD_JOBS=N       parallel compile jobs (default: CPU count)
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _flag(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip().lower()


def _find_nvcc() -> str | None:
    for cand in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds CMakeLists.txt in build_temp, then places the module where setuptools wants it."""

    def build_extensions(self):
        required = _flag("PACKED_SS_REQUIRE_NATIVE") in ("1", "true", "yes")
        built = []
        for ext in self.extensions:
            try:
                self._build_cmake(ext, required)
                built.append(ext)
            except Exception as err:  # noqa: BLE001 - any failure degrades to the torch epilogue
                if required:
                    raise
                self.warn(f"packed-ss: the native epilogue was NOT built ({err}); the engine will use the torch "
                          "epilogue. Building it needs cmake, a C++ compiler and pybind11 (see setup.py).")
        self.extensions[:] = built   # nothing to copy or install for a module that was not built

    def _build_cmake(self, ext, required: bool):
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("cmake not found on PATH")
        import pybind11

        nvcc = None if _flag("PACKED_SS_CUDA", "1") in ("0", "false", "no") else _find_nvcc()
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / "cmake"
        base = [f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={build_dir / 'out'}"]
        if shutil.which("ninja"):
            base.append("-GNinja")
        jobs = os.environ.get("PACKED_SS_BUILD_JOBS") or str(os.cpu_count() or 2)
        attempts = []
        if nvcc:
            archs = os.environ.get("PACKED_SS_CUDA_ARCHS", "80;90")
            attempts.append(("CPU + CUDA", [f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
                                            "-DPACKED_SS_CUDA=ON"]))
        if not nvcc or not required:
            attempts.append(("CPU", ["-DPACKED_SS_CUDA=OFF"]))
        last_err = None
        for label, extra in attempts:
            if build_dir.exists():
                shutil.rmtree(build_dir)   # a clean configure: the CUDA and CPU-only caches differ
            build_dir.mkdir(parents=True)
            start = time.perf_counter()
            print(f"packed-ss: building the native epilogue ({label}) with CMake ...", flush=True)
            try:
                subprocess.run([cmake, "-S", str(ROOT), "-B", str(build_dir), *base, *extra], check=True)
                subprocess.run([cmake, "--build", str(build_dir), "--parallel", jobs], check=True)
            except subprocess.CalledProcessError as err:
                last_err = err
                self.warn(f"packed-ss: the {label} build of the native epilogue failed ({err})")
                continue
            produced = sorted((build_dir / "out").glob("_epilogue*"))
            if not produced:
                raise RuntimeError(f"CMake produced no _epilogue module in {build_dir / 'out'}")
            out_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(produced[0], self.get_ext_fullpath(ext.name))
            print(f"packed-ss: native epilogue ({label}) built in {time.perf_counter() - start:.0f} s", flush=True)
            return
        raise RuntimeError(f"CMake build failed: {last_err}")


ext_modules = [] if _flag("PACKED_SS_NATIVE", "1") in ("0", "false", "no") else [CMakeExtension("packed_ss._epilogue")]

setup(
    packages=[*find_packages(include=["packed_ss", "packed_ss.*"]), "packed_ss.kernels"],
    package_dir={"packed_ss": "packed_ss", "packed_ss.kernels": "kernels"},
    package_data={"packed_ss": ["assets/*/*", "assets/*/*/*"]},   # a model and its drafting adapter
    ext_modules=ext_modules,
    cmdclass={"build_ext": CMakeBuild},
)

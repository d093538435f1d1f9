"""The memplan Python package for pip: the pure-Python half from python/memplan, the native module
(_memplan) built by CMake from this checkout.

    python3 -m pip install --no-build-isolation .

builds the libraries and the module in build-python/ (Release, no tests or benches) and installs
the package. MEMPLAN_CMAKE_BUILD_DIR=DIR reuses a build tree configured elsewhere (the test suite
points it at its own build, so the install costs no second build of the libraries).
"""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("MEMPLAN_CMAKE_BUILD_DIR") or os.path.join(ROOT, "build-python")
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_UNITY_BUILD=ON",
                "-DMEMPLAN_BUILD_TESTS=OFF", "-DMEMPLAN_BUILD_BENCH=OFF", "-DMEMPLAN_PYTHON=ON",
                f"-DPython_EXECUTABLE={sys.executable}"])
        jobs = str(len(os.sched_getaffinity(0)))
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "memplan_python", "-j", jobs])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(build_dir, "python", "memplan", "_memplan" + suffix)
        if not os.path.exists(built):
            found = glob.glob(os.path.join(build_dir, "python", "memplan", "_memplan*"))
            raise RuntimeError(f"memplan: CMake built {found or 'no module'} in {build_dir}, not _memplan{suffix} for "
                               f"{sys.executable}: configure that build with -DPython_EXECUTABLE={sys.executable}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target)


setup(ext_modules=[CMakeExtension("memplan._memplan")], cmdclass={"build_ext": CMakeBuild})

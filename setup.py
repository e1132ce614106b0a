"""Build the Cython twins in ``wirekit/_fast``.

``WIREKIT_PURE=1`` at install time builds nothing: wirekit then runs on its pure-Python
path.  Otherwise a failed compile fails the install, naming that option, rather than
silently installing a much slower wirekit.
"""

import importlib.util
import os
import sys
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _impl_module():
    # Load wirekit/_impl.py by path: the package itself cannot be imported before it is built.
    spec = importlib.util.spec_from_file_location(
        "_wirekit_impl", os.path.join(HERE, "wirekit", "_impl.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _explain_failure(exc):
    sys.stderr.write(
        "\nwirekit: building the Cython extensions failed "
        f"({type(exc).__name__}: {exc}).\n"
        "Install a C compiler and the Python headers, or install the pure-Python path "
        "explicitly with WIREKIT_PURE=1 (much slower).\n\n"
    )


class LoudBuildExt(build_ext):
    """build_ext that compiles the twins in parallel (one job per core, unless ``-j`` says
    otherwise) and turns a compile failure into an actionable message."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self):
        try:
            super().run()
        except Exception as exc:
            _explain_failure(exc)
            raise


#: setup.py commands that build nothing: an sdist, or the metadata a build frontend asks for
#: before a build.  Run without a building command they need no extension, so Cython is not run
#: (it adds a minute to an sdist, whose generated C MANIFEST.in leaves out anyway).
METADATA_COMMANDS = frozenset({"sdist", "egg_info", "dist_info"})
BUILDING_COMMANDS = frozenset(
    {
        "build",
        "build_ext",
        "bdist",
        "bdist_wheel",
        "bdist_egg",
        "install",
        "develop",
        "editable_wheel",
    }
)


def _builds_nothing(argv):
    return bool(METADATA_COMMANDS.intersection(argv)) and not BUILDING_COMMANDS.intersection(argv)


def _extensions():
    if _impl_module().pure_requested() or _builds_nothing(sys.argv):
        return []
    import numpy
    from Cython.Build import cythonize

    sources = sorted(glob(os.path.join("wirekit", "_fast", "*.pyx")))
    extensions = [
        Extension(
            "wirekit._fast." + os.path.splitext(os.path.basename(src))[0],
            [src],
            include_dirs=[numpy.get_include()],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            extra_compile_args=["-O3"],
        )
        for src in sources
    ]
    try:
        # generate the C in parallel too (worker processes: forked on Linux only, where no
        # process re-runs this file)
        jobs = (os.cpu_count() or 1) if sys.platform == "linux" else 0
        return cythonize(extensions, language_level=3, quiet=True, nthreads=jobs)
    except Exception as exc:
        _explain_failure(exc)
        raise


setup(ext_modules=_extensions(), cmdclass={"build_ext": LoudBuildExt})

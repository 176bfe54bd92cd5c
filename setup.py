"""The compiled kernels (engine/kernels/csrc), built by ``pip install -e .`` / ``pip
install .`` where a C++ compiler exists. Without one, or when the build fails, the
package installs without them and the server runs its torch-only paths (it says so in
one log line). ``SLOTSERVE_NO_EXT=1`` skips the build."""

import os
import sys

from setuptools import setup

ext_modules, cmdclass = [], {}
if os.environ.get("SLOTSERVE_NO_EXT") != "1":
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # no torch at build time: nothing to compile against
        BuildExtension = None
    if BuildExtension is not None:

        class OptionalBuildExtension(BuildExtension):
            """A failed build leaves the torch-only paths; it never fails the install."""

            def run(self):
                try:
                    super().run()
                except Exception as exc:  # noqa: BLE001 (any compiler trouble)
                    print(f"slotserve: compiled kernels not built ({exc}); torch-only paths", file=sys.stderr)

            def build_extension(self, ext):
                try:
                    super().build_extension(ext)
                except Exception as exc:  # noqa: BLE001
                    print(f"slotserve: {ext.name} not built ({exc}); torch-only paths", file=sys.stderr)

        flags = ["-O3", "-g0", "-fopenmp", "-std=c++20"]  # -g0: Python's own -g triples the build's time
        HEADERS = (
            "blocks.h",
            "blocks_impl.inc",
            "wide_impl.inc",
            "exp_impl.inc",
            "attention_impl.inc",
            "rope_impl.inc",
            "mlp_impl.inc",
            "delta_impl.inc",
            "conv_impl.inc",
            "float_impl.inc",
            "packed_impl.inc",
            "moe_op.inc",
            "pick_impl.inc",
        )
        UNITS = ("binding", "blocks_avx512", "blocks_avx2", "blocks_portable")
        ext_modules = [
            CppExtension(
                "engine.kernels._blocks",
                [f"engine/kernels/csrc/{f}.cpp" for f in UNITS],
                depends=[f"engine/kernels/csrc/{f}" for f in HEADERS],
                extra_compile_args=flags,
                extra_link_args=["-fopenmp"],
            )
        ]
        # ninja (a build requirement) compiles the four units side by side; without it
        # torch's BuildExtension compiles them one after another
        cmdclass = {"build_ext": OptionalBuildExtension.with_options(use_ninja=True)}

setup(ext_modules=ext_modules, cmdclass=cmdclass)

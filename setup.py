"""Builds strata's optional C++ extension (strata/csrc) with torch's own build helpers.

Everything else is in pyproject.toml. The extension is optional: where it cannot be
built (no compiler), the install goes on and strata runs torch ops instead
(strata/models/fused.py). Build it without pip's build isolation (`make venv` does), so
it compiles against the installed torch rather than a fresh download of one.
"""

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:  # no torch in the build environment: no extension
    ext_modules, cmdclass = [], {}
else:
    # x86-64-v3 (AVX2, FMA, F16C): fused.py loads the module only on CPUs that have them.
    # quant_vnni.cpp adds AVX-512 VNNI for its own functions, quant_avxvnni.cpp AVX-VNNI, attention_avx512.cpp AVX-512 and
    # attention_avx512bf16.cpp AVX-512 BF16 for theirs, activation_avx512.cpp AVX-512 for the MLP's
    # activation (target pragmas, never the build machine's -march); quant_ops.cpp, decode_ops.cpp and
    # decode_attention.cpp call them only where cpuid says the CPU has them.
    # -fopenmp: at::parallel_for runs on torch's OpenMP threads (the libgomp.so.1 torch loaded).
    ext_modules = [CppExtension("strata._decode_ops",
                                ["strata/csrc/decode_ops.cpp", "strata/csrc/decode_layer.cpp", "strata/csrc/decode_attention.cpp",
                                 "strata/csrc/quant_ops.cpp", "strata/csrc/quant_avx2.cpp",
                                 "strata/csrc/quant_vnni.cpp", "strata/csrc/quant_avxvnni.cpp", "strata/csrc/attention_avx2.cpp",
                                 "strata/csrc/attention_avx512.cpp", "strata/csrc/attention_avx512bf16.cpp",
                                 "strata/csrc/amx_gemm.cpp", "strata/csrc/amx_attention.cpp",
                                 "strata/csrc/activation_avx512.cpp", "strata/csrc/copy_cells.cpp"],
                                extra_compile_args=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"],
                                extra_link_args=["-fopenmp"], optional=True)]
    cmdclass = {"build_ext": BuildExtension.with_options(use_ninja=False)}

setup(ext_modules=ext_modules, cmdclass=cmdclass)

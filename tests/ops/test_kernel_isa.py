"""The kernel library: one build for every CPU, its variant chosen at run time."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tfsparse.ops import build
from tfsparse.ops import kernels

requires_library = pytest.mark.skipif(
    not kernels.LIBRARY_PATH.exists(), reason="compiled kernels not built (python -m tfsparse.ops.build)")
CHECK = "from tfsparse.ops import kernels; print(kernels.isa(), ','.join(kernels.supported_isas()))"


def _python(code, **env):
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True,
                          text=True, timeout=300)


def _functions_and_instructions(library):
    """{function name: set of instruction classes} from the library's disassembly."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(library)],
                             capture_output=True, text=True, check=True).stdout
    functions, current = {}, None
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = functions.setdefault(header.group(1), set())
        elif current is not None and "\t" in line:
            instruction = line.split("\t", 1)[1]
            mnemonic = instruction.split()[0] if instruction.split() else ""
            if "zmm" in instruction or re.search(r"%k[0-7]\b", instruction):
                current.add("avx512")
            if mnemonic.startswith("v"):  # VEX or EVEX encoded: AVX and later
                current.add("avx")
    return functions


@requires_library
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed")
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 instruction classes")
def test_wider_instructions_only_in_their_variants():
    # The library is built for generic x86-64: an AVX instruction anywhere but
    # in the avx2/avx512 variants (a shared inline function compiled with
    # their flags, say) would crash a CPU without AVX, and AVX-512 outside the
    # avx512 variant one without AVX-512.
    functions = _functions_and_instructions(kernels.LIBRARY_PATH)
    in_variant = {name: next((isa for isa in kernels.ISAS if f"tfsparse::isa_{isa}::" in name), None)
                  for name in functions}
    avx_outside = [f for f, used in functions.items() if "avx" in used and in_variant[f] not in ("avx2", "avx512")]
    avx512_outside = [f for f, used in functions.items() if "avx512" in used and in_variant[f] != "avx512"]
    assert avx_outside == [] and avx512_outside == []
    # And the variants are really there, each using its instructions.
    assert any("avx512" in functions[f] for f in functions if in_variant[f] == "avx512")
    assert any("avx" in functions[f] for f in functions if in_variant[f] == "avx2")
    assert any(in_variant[f] == "portable" for f in functions)


@requires_library
def test_the_widest_supported_variant_runs_by_default():
    isa, supported = _python(CHECK, TFSPARSE_ISA="").stdout.split()
    supported = supported.split(",")
    assert supported[-1] == "portable" and isa == supported[0]
    assert kernels.isa() in kernels.supported_isas()


@requires_library
@pytest.mark.parametrize("isa", kernels.ISAS)
def test_tfsparse_isa_forces_a_variant(isa):
    run = _python(CHECK, TFSPARSE_ISA=isa)
    if isa in kernels.supported_isas():
        assert run.stdout.split()[0] == isa, run.stderr
    else:
        assert f"TFSPARSE_ISA={isa} asks for a kernel variant this CPU does not support" in run.stderr


@requires_library
def test_tfsparse_isa_of_an_unknown_name_is_an_error():
    run = _python(CHECK, TFSPARSE_ISA="sse9")
    assert run.returncode != 0
    assert ("Received an invalid value for \"TFSPARSE_ISA\", expected one of "
            "'avx512', 'avx2', 'portable'. Received: TFSPARSE_ISA='sse9'") in run.stderr


@requires_library
def test_use_isa_refuses_names_and_variants_it_cannot_run():
    with pytest.raises(ValueError, match=r"expected one of 'avx512', 'avx2', 'portable'. Received: name='neon'"):
        with kernels.use_isa("neon"):
            pass
    for isa in set(kernels.ISAS) - set(kernels.supported_isas()):
        with pytest.raises(RuntimeError, match=f"does not support the '{isa}' kernel variant"):
            with kernels.use_isa(isa):
                pass


@requires_library
def test_use_isa_takes_names_in_any_case_as_the_environment_variable_does():
    # TFSPARSE_ISA=PORTABLE was taken while use_isa("PORTABLE") was refused.
    with kernels.use_isa(" PORTABLE "):
        assert kernels.isa() == "portable"


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """The loader with no library loaded yet, restored afterwards."""
    monkeypatch.setattr(kernels, "_state", {"loaded": False, "library": None, "supported": (), "default": None})
    return tmp_path


def test_a_missing_library_is_an_error_when_required(fresh_loader, monkeypatch):
    monkeypatch.setattr(kernels, "LIBRARY_PATH", fresh_loader / "missing.so")
    monkeypatch.setenv("TFSPARSE_REQUIRE_KERNELS", "1")
    with pytest.raises(RuntimeError, match=r"compiled kernels not found at .*missing.so.*TFSPARSE_REQUIRE_KERNELS is set"):
        kernels.available()


def test_a_missing_library_falls_back_with_a_warning(fresh_loader, monkeypatch, caplog):
    monkeypatch.setattr(kernels, "LIBRARY_PATH", fresh_loader / "missing.so")
    monkeypatch.delenv("TFSPARSE_REQUIRE_KERNELS", raising=False)
    assert not kernels.available() and kernels.isa() is None and kernels.supported_isas() == ()
    assert "using the slower pure-TensorFlow fallback" in caplog.text


@requires_library
def test_a_library_built_against_another_tensorflow_is_refused(fresh_loader, monkeypatch):
    library = fresh_loader / "_tfsparse_kernels.so"
    shutil.copy(kernels.LIBRARY_PATH, library)
    (fresh_loader / "_tfsparse_kernels.json").write_text(json.dumps({"tensorflow_version": "2.15.0"}))
    monkeypatch.setattr(kernels, "LIBRARY_PATH", library)
    monkeypatch.setattr(kernels, "BUILD_INFO_PATH", fresh_loader / "_tfsparse_kernels.json")
    monkeypatch.setenv("TFSPARSE_REQUIRE_KERNELS", "1")
    with pytest.raises(RuntimeError, match=r"built against TensorFlow 2\.15\.0, but TensorFlow 2\.\d+\.\d+ is "
                                           r"installed, whose ABI may differ, so they are not loaded"):
        kernels.available()


def test_disabling_kernels_while_requiring_them_is_an_error(fresh_loader, monkeypatch):
    monkeypatch.setenv("TFSPARSE_USE_KERNELS", "0")
    monkeypatch.setenv("TFSPARSE_REQUIRE_KERNELS", "1")
    with pytest.raises(RuntimeError, match="contradict each other"):
        kernels.available()


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="no aarch64 cross compiler (Debian's g++-aarch64-linux-gnu) installed")
def test_sources_compile_for_aarch64_with_the_portable_variant_only(tmp_path):
    # Off x86-64 only the portable variant exists (variants.inc); the sources
    # must compile there. TensorFlow's headers are the same on every
    # architecture; linking needs an aarch64 TensorFlow, which is not here.
    kernel_dir = kernels.LIBRARY_PATH.parent
    for source in sorted(kernel_dir.glob("*.cc")):
        subprocess.run(
            ["aarch64-linux-gnu-g++", "-c", "-O1", "-fPIC", "-fopenmp-simd", "-Wno-deprecated-declarations",
             str(source), "-o", str(tmp_path / (source.stem + ".o"))] + build.compile_flags(),
            check=True, capture_output=True, timeout=600)
    symbols = subprocess.run(["nm", "-C", str(tmp_path / "spmm.o")], capture_output=True, text=True).stdout
    assert "tfsparse::isa_portable::" in symbols and "tfsparse::isa_avx2::" not in symbols


@requires_library
def test_a_bad_tfsparse_isa_is_raised_at_every_call(fresh_loader, monkeypatch):
    # It was raised once; caught, the next calls ran the fallback silently,
    # even with TFSPARSE_REQUIRE_KERNELS=1.
    monkeypatch.setenv("TFSPARSE_ISA", "sse")
    for _ in range(3):
        with pytest.raises(ValueError, match='"TFSPARSE_ISA"'):
            kernels.available()


def test_a_required_missing_library_is_raised_at_every_call(fresh_loader, monkeypatch):
    monkeypatch.setattr(kernels, "LIBRARY_PATH", fresh_loader / "missing.so")
    monkeypatch.setenv("TFSPARSE_REQUIRE_KERNELS", "1")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="compiled kernels not found"):
            kernels.available()

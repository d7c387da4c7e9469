"""``compile: true``: the trial's model compiled with ``torch.compile`` (inductor), in place.

``nn.Module.compile`` compiles the module's ``forward`` in place rather than wrapping it in an
``OptimizedModule``, so ``state_dict`` keys stay the model's own (no ``_orig_mod.`` prefix): checkpoints of compiled
and uncompiled trials are interchangeable, and the optimizer, EMA, evaluation, per-bin GNS and DDP all see the same
module (tested). Compilation happens at the first forward of each kind (training, evaluation under
``inference_mode``), and its time falls in the first interval's training time.

Inductor needs a C++ compiler on CPU and Triton on a GPU; `compile_problem` says, in one line, when the machine has
neither, so the trial stops before any compute (`trainables.trial.check_trial`). A toolchain that is there but
fails (e.g. missing headers) fails at the first step; `compile_failure_in` turns that into one line too.
"""

from __future__ import annotations

import torch

from trainables.config import ConfigError
from trainables.exc_chain import exception_in_chain

BACKEND = "inductor"  # torch.compile's default; tests of the checkpoint layout swap in "eager" (no code generation)


class CompileError(ConfigError):
    """``compile: true`` on a machine where torch.compile cannot run (one line: why, and the fix)."""


def compile_problem(device_type: str) -> str | None:
    """Why torch.compile's inductor backend cannot run for ``device_type`` ("cpu" or "cuda") here, or None."""
    if BACKEND != "inductor":
        return None
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "compile: true needs Triton for torch.compile on a GPU, and it is not installed; install triton or "
        return None
    from torch._inductor import config as inductor_config
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception:  # noqa: BLE001 - InvalidCxxCompiler and whatever a broken toolchain raises
        cxx = inductor_config.cpp.cxx
        tried = ", ".join(map(str, cxx if isinstance(cxx, (list, tuple)) else (cxx,)))
        return (
            f"compile: true needs a C++ compiler for torch.compile on CPU and none was found (tried: {tried}); "
            "install g++ (or point CXX at one) or "
        )
    return None


def check_compile(device_type: str) -> None:
    """Raise CompileError when torch.compile cannot run for ``device_type`` on this machine."""
    problem = compile_problem(device_type)
    if problem:
        raise CompileError(problem + "set compile: false")


def compile_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Compile ``model`` in place (its ``state_dict`` keys unchanged); returns it."""
    check_compile(torch.device(device).type)
    model.compile(backend=BACKEND)
    return model


def compile_failure_in(exc: BaseException) -> CompileError | None:
    """The torch.compile failure behind ``exc`` -- raised directly, chained, or inside Ray Train's wrappers of a
    worker's exception (`trainables.exc_chain`) -- as one CompileError line, else None."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import CppCompileError, InductorError, InvalidCxxCompiler

    e = exception_in_chain(exc, (BackendCompilerFailed, InductorError, CppCompileError, InvalidCxxCompiler))
    if e is None:
        return None
    inner = getattr(e, "inner_exception", None) or e  # BackendCompilerFailed wraps what the backend raised
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    why = f"{type(inner).__name__}: {lines[0][:200]}" if lines else type(inner).__name__
    return CompileError(f"torch.compile failed on this machine ({why}); set compile: false")

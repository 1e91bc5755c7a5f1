"""What every ``xmem`` subcommand shares: exit codes, the errors that become them, how a
traced script's failures are reported, and the checks of the inputs a script command takes.
(``main.py`` holds the commands; ``advise.py``, ``sweep.py``, ``ops.py`` and ``cache.py`` one each.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Iterator

EXIT_OK, EXIT_USER_CODE, EXIT_USAGE, EXIT_MISMATCH = 0, 1, 2, 3
MAX_CAPACITY = 1 << 50  # --capacity: 1 PiB, the simulator's largest request (trace.MAX_REQUEST_BYTES)
REPORT_HINT = "this is a bug in xmem, not in your script: please report it with the command line and the lines above"


class CLIError(Exception):
    """A failure the command has described: its exit code, and its kind for ``--json``."""

    code = EXIT_USAGE
    kind = "bad_input"

    def json(self) -> dict:
        return {"ok": False, "error": self.kind, "message": str(self), "exit_code": self.code}


class InputError(CLIError):
    """Bad input from the user (a file, a flag, a config string): exit code 2, before any tracing."""


class ScriptFailed(CLIError):
    """The user's script failed while traced (its traceback is printed): exit code 1."""

    code = EXIT_USER_CODE
    kind = "script_failed"

    def __init__(self, message: str, status: object = None):
        super().__init__(message)
        self.status = status  # the script's own sys.exit status, if that is how it ended

    def json(self) -> dict:
        return {**super().json(), "script_exit_status": self.status}


class HostMemoryShort(CLIError):
    """Real mode needs more host memory than this machine has to spare: stopped in time, exit 1."""

    code = EXIT_USER_CODE
    kind = "host_memory"


class OutputFailed(CLIError):
    """The estimate was made but an output file could not be written (a full disk): exit
    code 1, and with ``--json`` the estimate itself is in the JSON object, not lost."""

    code = EXIT_USER_CODE
    kind = "output_failed"

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result

    def json(self) -> dict:
        return {**super().json(), "estimate": self.result}


class Interrupted(CLIError):
    """Ctrl-C (SIGINT) stopped the command: exit code 1, one JSON object with ``--json``."""

    code = EXIT_USER_CODE
    kind = "interrupted"


class XmemFailed(CLIError):
    """xmem itself failed (no frame of the user's code is involved): exit code 1."""

    code = EXIT_USER_CODE
    kind = "xmem_failed"


def from_user_code(e: BaseException) -> bool:
    """Did ``e`` pass through a frame of the user's code (not xmem, torch, the standard library)?"""
    from xmem_engine.tracing.frames import is_user_file

    tb = e.__traceback__
    while tb is not None:
        if is_user_file(tb.tb_frame.f_code.co_filename):
            return True
        tb = tb.tb_next
    return False


@contextlib.contextmanager
def running_script(command: str, script: str, mode: str) -> Iterator[None]:
    """The one place that turns a traced script's failures into messages and exit codes:
    a bad ``--set`` is bad input; an op the mode cannot run is xmem's message; the script's
    own exception shows its traceback (from the user's code on), a syntax error only the
    offending line; its ``sys.exit(n != 0)`` is a failure with that status; an exception
    that never passed through the user's code is xmem's own failure."""
    import os
    import traceback

    from xmem_engine.overrides import OverrideError
    from xmem_engine.simulation.alloc_conf import AllocConfError
    from xmem_engine.tracing import HostMemoryError, UnsupportedOpError, user_traceback_lines

    try:
        yield
    except (OverrideError, AllocConfError) as e:
        raise InputError(str(e)) from None
    except CLIError:
        raise
    except UnsupportedOpError as e:
        print(f"xmem {command}: {e}", file=sys.stderr)
        raise ScriptFailed(str(e)) from None
    except HostMemoryError as e:
        print(f"xmem {command}: {e}", file=sys.stderr)
        raise HostMemoryShort(str(e)) from None
    except SyntaxError as e:
        if not from_user_code(e) and os.path.abspath(e.filename or "") != os.path.abspath(script):
            raise xmem_failed(command, e) from None
        print("".join(traceback.format_exception_only(type(e), e)), end="", file=sys.stderr)
        message = f"{script} has a syntax error (line {e.lineno})"
        print(f"xmem {command}: {message}", file=sys.stderr)
        raise ScriptFailed(message) from None
    except Exception as e:
        if not from_user_code(e):
            raise xmem_failed(command, e) from None
        print("".join(user_traceback_lines(e)), end="", file=sys.stderr)
        message = f"{script} raised {type(e).__name__}: {e} (mode {mode})"
        print(f"xmem {command}: {script} raised {type(e).__name__} (mode {mode})", file=sys.stderr)
        hint = torchrun_hint(e)
        if hint:
            print(f"xmem {command}: {hint}", file=sys.stderr)
            message += f"; {hint}"
        raise ScriptFailed(message) from None
    except SystemExit as e:
        from xmem_engine.tracing.patches import ProcessExit

        how = f"ended the process with os._exit({e.code})" if isinstance(e, ProcessExit) else f"exited with status {e.code}"
        message = f"{script} {how}"
        print(f"xmem {command}: {message}", file=sys.stderr)
        raise ScriptFailed(message, status=e.code) from None


def torchrun_hint(e: BaseException) -> str | None:
    """A script written for torchrun, run without --world-size, reads torchrun's variables."""
    from xmem_engine.tracing.shims.distributed import ENV_KEYS

    if isinstance(e, KeyError) and e.args and e.args[0] in ENV_KEYS:
        return (f"the script reads ${e.args[0]}, which torchrun sets: estimate one of its ranks with "
                "--world-size N (and --rank R)")
    return None


def xmem_failed(command: str, e: BaseException) -> XmemFailed:
    import traceback

    print("".join(traceback.format_exception(type(e), e, e.__traceback__)), end="", file=sys.stderr)
    message = f"xmem failed: {type(e).__name__}: {e}"
    print(f"xmem {command}: {message}\n  {REPORT_HINT}", file=sys.stderr)
    return XmemFailed(message)


def check_environment() -> None:
    """Settings read from the environment are input too: refuse a bad one before tracing."""
    import os

    from xmem_engine.tracing.compiler.compile_cache import cache_limit_bytes
    from xmem_engine.tracing.host_memory import ENV, parse_bytes

    try:
        if os.environ.get(ENV):
            parse_bytes(os.environ[ENV])
        cache_limit_bytes()
    except ValueError as e:
        raise InputError(str(e)) from None


def check_output(path: str | None, flag: str, force: bool, inputs: tuple[str, ...] = ()) -> None:
    """An output file the command will write: never one of its inputs, in a folder that
    exists, and not an existing file unless ``--force``. Checked before any work starts."""
    import os

    if path is None:
        return
    if not path.strip():
        raise InputError(f"{flag}: empty file name")
    for src in inputs:
        if os.path.exists(path) and os.path.exists(src) and os.path.samefile(path, src):
            raise InputError(f"{flag} {path}: that is the input {src}; write the output to another file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"{flag} {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise InputError(f"{flag} {path}: that is a folder; give a file name")
    if os.path.exists(path) and not force:
        raise InputError(f"{flag} {path}: the file exists; pass --force to overwrite it")


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def torch_version_arg(text: str) -> str:
    """``--torch``: a version xmem can read (checked before any code runs)."""
    from xmem_engine.gpus.cuda_libraries import target_version

    try:
        target_version(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def script_inputs(args) -> tuple:
    """The script, GPU, ``--set`` and ``--iterations`` of ``estimate`` / ``advise``, checked."""
    from xmem_engine.estimate import resolve_gpu
    from xmem_engine.inputs import DEFAULT_GPU, ENV_GPU, env_gpus
    from xmem_engine.gpus import GPUCatalogError, UnknownGPUError
    from xmem_engine.gpus.cudnn import WorkspaceTableError, check_setting
    from xmem_engine.overrides import OverrideError, parse_overrides

    check_script(args.script)
    if args.gpu is not None and not args.gpu.strip():
        raise InputError("--gpu: empty GPU name; `xmem gpus` lists the names")
    listed = env_gpus() if args.gpu is None else []
    try:  # XMEM_GPU may list several (for sweeps and %%xmem): one estimate is for the first
        gpu = resolve_gpu(args.gpu or (listed[0] if listed else DEFAULT_GPU))
    except UnknownGPUError as e:  # name the variable: the user may not know it is set
        raise InputError(f"{ENV_GPU}: {e}" if listed else str(e)) from None
    except GPUCatalogError as e:
        raise InputError(str(e)) from None
    try:
        overrides = parse_overrides(args.overrides)
        check_setting()
    except (OverrideError, WorkspaceTableError) as e:
        raise InputError(str(e)) from None
    if args.iterations is not None and args.iterations < 1:
        raise InputError(f"--iterations must be at least 1, not {args.iterations}")
    return gpu, overrides


def batch_value(script: str, var: str, flag: str) -> int:
    """The positive integer the script assigns ``var`` at top level (bad input otherwise)."""
    from xmem_engine.overrides import OverrideError, positive_int_value

    try:
        return positive_int_value(script, var)
    except (OverrideError, SyntaxError) as e:
        raise InputError(f"{flag} {var}: {e}") from None


def check_script(path: str) -> None:
    import os

    if not os.path.isfile(path):
        raise InputError(f"no such script: {path}" + (" (it is a folder)" if os.path.isdir(path) else ""))


def alloc_conf_arg(text: str | None):
    """``--alloc-conf``: PyTorch's grammar, and a setting xmem can simulate."""
    from xmem_engine.simulation.alloc_conf import AllocConfError, parse_alloc_conf, require_native

    if text is None:
        return None
    try:
        return require_native(parse_alloc_conf(text))
    except AllocConfError as e:
        raise InputError(f"--alloc-conf {text!r}: {e}") from None


def add_target_flags(p: argparse.ArgumentParser) -> None:
    """``--gpu`` and ``--set`` as ``estimate`` and ``advise`` take them: one GPU, one value each
    (``xmem sweep`` takes lists of both)."""
    p.add_argument("--gpu", default=None,
                   help="target GPU (see `xmem gpus`); default: the first of $XMEM_GPU, else A100-SXM4-40GB")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="VAR=VALUE",
                   help="override a top-level assignment of the script, e.g. --set batch_size=64 (repeatable)")


def add_trace_flags(p: argparse.ArgumentParser) -> None:
    """``--mode``, ``--iterations`` and ``--torch``: how a script is traced, the same for
    ``estimate``, ``advise`` and ``sweep``."""
    from xmem_engine.trace import MODES

    p.add_argument("--mode", choices=MODES, default="auto",
                   help="fake (no values: fast, little host memory), real (CPU tensors) or auto (fake, real "
                   "where values decide; the default)")
    p.add_argument("--iterations", type=int, metavar="N",
                   help="trace only the first N training iterations (the peak is usually reached by the 2nd)")
    p.add_argument("--torch", dest="torch_version", metavar="VERSION", type=torch_version_arg,
                   help="estimate for this PyTorch version's CUDA behaviour (default: the installed one)")

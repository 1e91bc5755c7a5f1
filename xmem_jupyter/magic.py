"""``%%xmem`` / ``%xmem`` / ``%xmem_config``: the IPython magics.

The magic runs the cell with the tracer (the cell's ``cuda`` is a virtual device on the CPU),
shows a progress indicator while it does, and displays one output that holds both the
interactive widget's view and a static report (``application/vnd.xmem.report+json`` with an
HTML summary): JupyterLab shows the widget while the kernel holds it and the report once it is
gone (``labextension/src/live.ts``). The report follows the widget: when the GPU or batch size
changes there, it is updated in place (``update_display``).
"""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from xmem_engine.gpus import UnknownGPUError, get_gpu, load_catalog
from xmem_engine.overrides import batch_var_in
from xmem_engine.trace import MODES
from xmem_engine.tracing import strip_to_user_code

from xmem_jupyter.advice import advise_cell
from xmem_jupyter.batching import BatchSpecError, current_batch, default_batch_values, parse_batch_values
from xmem_jupyter.cellcode import cell_filename, running_cell_number
from xmem_jupyter.config import Config
from xmem_jupyter.progress import Progress, TracerProbe
from xmem_jupyter.report import one_line, report_bundle
from xmem_jupyter.session import Session

class CellSyntaxError(Exception):
    """A syntax error in the cell, shown as Python shows one typed at the prompt: the line
    and the caret, no frames (IPython would list its own and xmem's above a SyntaxError)."""

    def __init__(self, error: SyntaxError):
        super().__init__(str(error))
        self.error = error

    def _render_traceback_(self) -> list[str]:  # IPython's hook for an exception's display
        import traceback

        return [line.rstrip("\n") for line in traceback.format_exception_only(type(self.error), self.error)]


@magics_class
class XmemMagics(Magics):
    """Holds the notebook's defaults (``%xmem_config``)."""

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell, **kwargs)
        self.config_defaults = Config()

    # ------------------------------------------------------------------ %%xmem
    @magic_arguments()
    @argument("--gpu", "-g", action="append", metavar="NAME",
              help="target GPU (catalog name, forgiving: a100, 'H100 80GB', T4). Repeat to compare GPUs; "
                   "the first is the one shown. Default: %%xmem_config --gpu, else $XMEM_GPU, else A100-SXM4-40GB.")
    @argument("--batch-var", "-b", metavar="VAR",
              help="variable (assigned in the cell, or in the namespace) or keyword argument "
                   "(per_device_train_batch_size=4 in a call) that holds the batch size: its slider. Default: "
                   "the one batch-size name (batch_size, batch, bs, per_device_train_batch_size, ...) the cell "
                   "gives one positive integer, if any")
    @argument("--batch-values", metavar="LIST|RANGE",
              help="slider values: 8,16,32 | 8:128 (powers of two) | 8:64:8 (step). Default: powers of "
                   "two from VAR/8 to VAR*8")
    @argument("--iterations", "-n", type=int, default=None, metavar="N",
              help="run the cell's training step N times, the model and optimizer built once (later "
                   "steps see the optimizer's state and a warm allocator cache). Default: the steady "
                   "state, a cell that runs one step runs it twice; -n 1: the first step alone")
    @argument("--mode", choices=MODES, default=None,
              help="fake: shapes only (fast, no memory); real: real CPU tensors; auto (default): fake, "
                   "falling back to real when the code needs tensor values")
    @argument("--alloc-conf", metavar="STR", default=None,
              help="PYTORCH_CUDA_ALLOC_CONF of the target run, e.g. 'expandable_segments:True'")
    @argument("--compile", choices=("inductor", "eager"), default=None,
              help="torch.compile in the cell: inductor (default: compiled for the target GPU by Inductor, "
                   "on the CPU; needs a CUDA build of torch with Triton) or eager (compiled code runs "
                   "eagerly, to see what compiling saves; the widget has a toggle)")
    @argument("-o", "--output", metavar="NAME",
              help="store the Estimate object in this variable (with --advise: the Advice, whose .baseline "
                   "is the Estimate and .levers each change's)")
    @argument("--world-size", type=int, default=None, metavar="N",
              help="one rank of a distributed run of N processes (a cell written for torchrun: "
              "init_process_group, DDP, FSDP); the figures are that rank's GPU")
    @argument("--rank", type=int, default=None, metavar="R", help="the rank traced (default 0; needs --world-size)")
    @argument("--quiet", "-q", action="store_true", help="no widget: print one line")
    @argument("--max-batch", action="store_true",
              help="search the largest batch size that fits each GPU (of --batch-var, or the name found)")
    @argument("--advise", action="store_true",
              help="also measure what would make it fit: each usual change (allocator settings, optimizer, "
                   "autocast, activation checkpointing, Adafactor; with --batch-var accumulation and a smaller "
                   "batch) applied to the step and estimated again (the widget's 'what would make it fit')")
    @argument("statement", nargs="*", help="(line magic) the statement or call to estimate")
    @line_cell_magic
    def xmem(self, line: str, cell: str | None = None):
        """Estimate the GPU memory of a PyTorch training step, by running it on the CPU.

        The cell runs unchanged: ``.cuda()``, ``device="cuda"`` and ``torch.cuda.*`` address a
        virtual GPU, so no GPU is needed. The result shows the peak memory on the chosen GPU
        against its capacity, what it is made of, a tensor-lifetime flame chart and the
        allocator's memory over the step, with controls to switch GPU (no re-tracing), try
        expandable segments, and move the batch size.

        Examples::

            %load_ext xmem_jupyter

            %%xmem --gpu A100-40GB --gpu T4
            model = torch.nn.Linear(4096, 4096).cuda()
            opt = torch.optim.AdamW(model.parameters())
            x = torch.randn(64, 4096, device="cuda")
            model(x).sum().backward()
            opt.step()

            %%xmem --batch-var batch --batch-values 16:256 --max-batch -o est
            batch = 64
            ...

            %xmem --quiet train_step(model, x)      # line magic: one statement
            %xmem_config --gpu h100                 # the notebook's default GPU

        What persists in the namespace afterwards: plain Python values the cell assigned
        (numbers, strings, bools, None, and lists / tuples / dicts / sets of them) and the
        ``-o`` variable. Tensors, modules, optimizers, functions, classes and imports the cell
        made do not: they would hold virtual-GPU (fake) tensors (import and define things in
        a plain cell before). Variables that existed before keep their objects and state (a
        ``model.cuda()`` in the cell does not move your model), and the random-number
        generators are as they were.

        Errors in the cell show the cell's traceback with its line numbers; interrupting the
        kernel stops tracing and leaves the namespace unchanged.
        """
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in tracebacks
        args = parse_argstring(self.xmem, line)
        if cell is None:
            source = " ".join(args.statement)
            if not source.strip():
                raise UsageError("%xmem needs a statement, e.g. %xmem train_step(model, batch); "
                                 "or use %%xmem as a cell magic")
        else:
            if args.statement:
                raise UsageError(f"%%xmem: unexpected arguments {' '.join(args.statement)!r}; "
                                 "see %%xmem? for the options")
            source = "\n" + cell  # line numbers as in the cell (line 1 is the %%xmem line)
        return self._run(args, source)

    def _gpus(self, names: list[str] | None) -> list[str]:
        catalog = load_catalog()
        out = []
        for name in names or self.config_defaults.default_gpus():
            try:
                out.append(get_gpu(name, catalog).key)
            except UnknownGPUError as e:
                raise UsageError(str(e)) from None
        return list(dict.fromkeys(out))

    def _run(self, args, source: str):
        __tracebackhide__ = True  # noqa: F841
        ns = self.shell.user_ns
        cfg = self.config_defaults
        gpus = self._gpus(args.gpu)
        if args.iterations is not None and args.iterations < 1:
            raise UsageError("--iterations must be at least 1")
        session = Session(source=source, namespace=ns, gpus=gpus, mode=args.mode or cfg.default_mode(),
                          alloc_conf=cfg.default_alloc_conf() if args.alloc_conf is None else args.alloc_conf,
                          filename=cell_filename(running_cell_number(self.shell)), iterations=args.iterations,
                          compile=args.compile)
        try:
            from xmem_engine.simulation.alloc_conf import parse_alloc_conf, require_native

            require_native(parse_alloc_conf(session.alloc_conf))
        except Exception as e:  # the allocator's own error text says what is wrong
            raise UsageError(f"--alloc-conf: {e}") from None
        from xmem_engine.gpus.cudnn import WorkspaceTableError, check_setting

        try:
            check_setting()
        except WorkspaceTableError as e:
            raise UsageError(str(e)) from None
        if args.world_size is not None or args.rank is not None:
            from xmem_engine.tracing.shims.distributed import World

            if args.world_size is None:
                raise UsageError("--rank needs --world-size N (the number of processes torchrun starts)")
            try:
                session.world = World(args.world_size, args.rank or 0)
            except ValueError as e:
                raise UsageError(f"--world-size / --rank: {e}") from None
        inferred = False
        if not args.batch_var:  # the one batch-size name the cell assigns or passes to a call: its slider
            guess = batch_var_in(source)
            if guess is not None and current_batch(source, guess, ns) is not None:
                args.batch_var, inferred = guess, True
        if args.max_batch and not args.batch_var:
            raise UsageError("--max-batch needs --batch-var VAR (the variable that holds the batch size): "
                             "the cell gives no batch-size name one positive integer")
        if args.batch_var:
            current = current_batch(source, args.batch_var, ns)
            if current is None:
                raise UsageError(f"--batch-var {args.batch_var}: the cell does not assign it a positive "
                                 f"integer (e.g. {args.batch_var} = 32), gives no call one positive integer as "
                                 f"{args.batch_var}=..., and the namespace has no positive integer {args.batch_var}")
            try:
                values = parse_batch_values(args.batch_values) if args.batch_values \
                    else default_batch_values(current)
            except BatchSpecError as e:
                raise UsageError(str(e)) from None
            session.batch_var, session.batch = args.batch_var, current
            session.batch_values = sorted(set(values) | {current})

        had_loop_var = "_xmem_iteration" in ns
        progress = None if args.quiet else Progress()
        handle = display(progress, display_id=True) if progress is not None else None
        probe = TracerProbe()
        largest: dict[str, int] = {}
        try:
            if progress is not None:
                progress.start("tracing on the CPU:", probe)
            try:
                est = session.estimate(session.batch, gpus[0], setup=(probe.setup,))
                others = [session.estimate(session.batch, g) for g in gpus[1:]]
                if args.max_batch:
                    for g in gpus:
                        if progress is not None:
                            progress.start(f"searching the largest {args.batch_var} for {g}:")
                        largest[g] = session.largest_batch(g)
                advice = None
                if args.advise:
                    say = None if progress is None else \
                        (lambda m: progress.start(f"what would make it fit: measuring {m}:"))
                    advice = advise_cell(session, gpus[0], base=est, progress=say)
                    advice.batch_var_inferred = inferred
            except KeyboardInterrupt:
                raise KeyboardInterrupt("xmem: tracing interrupted; the namespace is as it was") from None
            except SyntaxError as e:  # the cell's line and caret only: nothing of xmem ran it
                raise CellSyntaxError(e) from None
            except Exception as e:
                raise strip_to_user_code(e) from None  # the cell's frames, not xmem's or IPython's
            finally:
                if not had_loop_var:
                    ns.pop("_xmem_iteration", None)
        finally:
            if progress is not None:
                progress.stop()
                handle.update({"text/plain": ""}, raw=True)
                progress.close()
        if args.output:
            ns[args.output] = est if advice is None else advice
        if args.quiet:
            found = (session.searches[(g, session.alloc_conf)] for g in largest)
            names = {e.gpu: e.gpu_name for e in (est, *others)}
            extra = "".join(f" | largest {args.batch_var} on {names.get(g, g)}: {s.answer()}"
                            for g, s in zip(largest, found))
            print(one_line(est, others) + extra)
            if advice is not None:
                print(advice.summary())
            return None

        from xmem_jupyter.widget import XmemWidget

        widget = XmemWidget(est, session=session, gpus=gpus)
        if advice is not None:
            widget.set_advice(advice)
        # one output: the live widget and the report it falls back to (report.report_bundle)
        result = display(report_bundle(est, others, largest, widget=widget, advice=advice), raw=True,
                         display_id=True)

        def follow(new_est) -> None:
            shown = widget.session  # the compile toggle shows another Session of the cell
            rest = [shown.estimate(widget.batch, g, widget.conf) for g in gpus if g != new_est.gpu]
            found = {g: b for (g, c), b in shown.largest.items() if c == widget.conf}
            bundle = report_bundle(new_est, rest, found, widget=widget, advice=widget.current_advice())
            result.update(bundle, raw=True)  # front ends that route a callback's display updates
            widget.carry_report(bundle)  # JupyterLab: through the view (labextension/src/live.ts)

        widget.on_change = follow
        return None

    # ------------------------------------------------------------------ %xmem_config
    @magic_arguments()
    @argument("--gpu", "-g", action="append", metavar="NAME", help="default GPU(s) for %%xmem in this notebook")
    @argument("--mode", choices=MODES, help="default trace mode")
    @argument("--alloc-conf", metavar="STR", help="default PYTORCH_CUDA_ALLOC_CONF of the target run")
    @argument("--reset", action="store_true", help="back to the environment's / built-in defaults")
    @line_magic
    def xmem_config(self, line: str):
        """Set the notebook's defaults for %%xmem; without options, print them.

        Example: ``%xmem_config --gpu H100 --alloc-conf expandable_segments:True``.
        The environment can set them too: ``XMEM_GPU`` (comma-separated), ``XMEM_MODE``,
        ``PYTORCH_CUDA_ALLOC_CONF``.
        """
        args = parse_argstring(self.xmem_config, line)
        cfg = self.config_defaults
        if args.reset:
            self.config_defaults = cfg = Config()
        if args.gpu:
            cfg.gpus = self._gpus(args.gpu)
        if args.mode:
            cfg.mode = args.mode
        if args.alloc_conf is not None:
            cfg.alloc_conf = args.alloc_conf
        print(cfg.describe())


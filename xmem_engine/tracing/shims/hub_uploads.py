"""Nothing reaches the Hugging Face Hub from traced code: ``push_to_hub`` and the Hub API's
other writes are answered as a successful upload would be, and noted.

Why: a fine-tuning notebook ends with ``trainer.push_to_hub()`` or ``model.push_to_hub(...)``,
and ``TrainingArguments(push_to_hub=True)`` makes a repository when the Trainer is built and
uploads each checkpoint. Traced, those calls would create the user's repository and commit
to it from an estimate: a config, a model card, placeholder weights (``checkpoints.py`` writes
no tensors) over the real ones. Every write of ``huggingface_hub.HfApi`` (transformers 5 and
TRL call them on an ``HfApi`` of their own; ``huggingface_hub.create_repo`` and its siblings
are an instance's bound methods) returns what the Hub would (a ``RepoUrl``, a ``CommitInfo``,
a finished ``Future`` for ``run_as_future``) and sends nothing. Reads (downloads, ``whoami``)
go on as they would.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import sys
import types
from typing import Any, Callable, Iterator

from xmem_engine.tracing.frames import user_frame
from xmem_engine.tracing.patches import on_import, patched_attr

#: ``HfApi`` methods that change something on the Hub, and what each returns
COMMITS = ("create_commit", "upload_file", "upload_folder", "delete_file", "delete_files", "delete_folder")
NOTHING = ("upload_large_folder", "delete_repo", "update_repo_settings", "move_repo", "super_squash_history",
           "create_branch", "delete_branch", "create_tag", "delete_tag", "preupload_lfs_files",
           "create_pull_request", "merge_pull_request", "add_collection_item", "create_collection")
WRITES = ("create_repo",) + COMMITS + NOTHING
NOTE = ("Hugging Face Hub: nothing sent ({calls}): an estimate makes no repository and uploads nothing; "
        "the calls returned as a successful upload would")
FAKE_OID = "0" * 40


def _repo_id(args: tuple, kwargs: dict) -> str:
    return str(kwargs.get("repo_id") or (args[0] if args else "") or "user/model")


def answer(name: str, hub: Any) -> Callable[..., Any]:
    """What ``HfApi.<name>`` returns, made without the Hub."""

    def create_repo(api: Any, *args: Any, **kwargs: Any) -> Any:
        repo_id = _repo_id(args, kwargs)
        if "/" not in repo_id:
            repo_id = f"user/{repo_id}"
        prefix = {"dataset": "datasets/", "space": "spaces/"}.get(kwargs.get("repo_type") or "", "")
        return hub.RepoUrl(f"{hub.constants.ENDPOINT}/{prefix}{repo_id}")

    def commit(api: Any, *args: Any, **kwargs: Any) -> Any:
        repo_id = _repo_id(args, kwargs)
        info = hub.CommitInfo(commit_url=f"{hub.constants.ENDPOINT}/{repo_id}/commit/{FAKE_OID}",
                              commit_message=str(kwargs.get("commit_message") or "Upload"), commit_description="",
                              oid=FAKE_OID)
        return _finished(info) if kwargs.get("run_as_future") else info

    def nothing(api: Any, *args: Any, **kwargs: Any) -> Any:
        return _finished(None) if kwargs.get("run_as_future") else None

    return create_repo if name == "create_repo" else commit if name in COMMITS else nothing


def _finished(value: Any) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(value)
    return future


@contextlib.contextmanager
def hub_writes_held_back(tracer: Any, stack: contextlib.ExitStack) -> Iterator[None]:
    """:data:`WRITES` of ``HfApi`` answered by :func:`answer` while the block lasts, the
    module-level aliases (``huggingface_hub.create_repo``, bound to its default ``HfApi``)
    included, and in any module that imported one; each call site noted once."""
    calls: dict[str, list[str]] = {}
    made: set[str] = set()  # the repositories the traced code made or pushed to

    def held(name: str, hub: Any) -> Callable[..., Any]:
        answered = answer(name, hub)

        def method(api: Any, *args: Any, **kwargs: Any) -> Any:
            calls.setdefault(user_frame(2) or "?", []).append(name)
            out = answered(api, *args, **kwargs)
            repo = getattr(out, "repo_id", None) or _repo_id(args, kwargs)
            made.add(repo)
            return out

        method.__name__ = name
        return method

    def patch(hf_api: Any) -> None:
        import huggingface_hub as hub
        import huggingface_hub.file_download as file_download

        originals: dict[Any, str] = {}
        for name in WRITES:
            fn = getattr(hf_api.HfApi, name, None)
            if fn is not None:
                originals[fn] = name
                stack.enter_context(patched_attr(hf_api.HfApi, name, held(name, hub)))
        download = file_download.hf_hub_download
        stack.enter_context(patched_attr(file_download, "hf_hub_download", not_yet_there(download)))
        # what other modules hold of them: huggingface_hub.create_repo (bound to its default HfApi),
        # a `from huggingface_hub import hf_hub_download` made before the trace began
        for mod in list(sys.modules.values()):
            space = getattr(mod, "__dict__", None)
            if not space or mod is file_download:
                continue
            for attr, value in list(space.items()):
                if value is download:
                    stack.enter_context(patched_attr(mod, attr, file_download.hf_hub_download))
                elif type(value) is types.MethodType and isinstance(value.__self__, hf_api.HfApi):
                    name = originals.get(value.__func__)
                    if name is not None:
                        stack.enter_context(patched_attr(mod, attr, getattr(value.__self__, name)))

    def not_yet_there(download: Callable[..., Any]) -> Callable[..., Any]:
        """``hf_hub_download`` that finds nothing in a repository the traced code "made": the
        model card ``push_to_hub`` reads back (it is not there: the repository may not exist)."""
        from huggingface_hub.errors import EntryNotFoundError

        class NotOnTheHub(EntryNotFoundError):
            pass

        def hf_hub_download(repo_id: str, filename: str, *args: Any, **kwargs: Any) -> Any:
            if repo_id in made:
                raise NotOnTheHub(f"{filename} is not in {repo_id}: the traced code's push made nothing there")
            return download(repo_id, filename, *args, **kwargs)

        return hf_hub_download

    def said() -> None:
        if calls:
            tracer.notes.append(NOTE.format(calls="; ".join(
                f"{', '.join(_counted(names))} at {where}" for where, names in calls.items())))

    stack.callback(said)
    with on_import(["huggingface_hub.hf_api"], patch):
        yield


def _counted(names: list[str]) -> list[str]:
    return [f"{n} ({names.count(n)} times)" if names.count(n) > 1 else n for n in dict.fromkeys(names)]

"""Whose code a frame runs (xmem_engine/tracing/frames.py): the user's, or a library's. A Debian
or Ubuntu system Python installs packages in ``dist-packages``, not ``site-packages``."""

from __future__ import annotations

from xmem_engine.tracing.frames import count_as_user, is_user_file, library_frame


def test_installed_packages_are_not_the_users_code_in_either_folder():
    assert not is_user_file("/home/u/.venv/lib/python3.11/site-packages/transformers/trainer.py")
    assert not is_user_file("/usr/lib/python3/dist-packages/transformers/trainer.py")
    assert not is_user_file("/usr/local/lib/python3.11/dist-packages/peft/tuners/lora/layer.py")
    assert is_user_file("/home/u/project/train.py")
    assert is_user_file("/home/u/project/train_utils.py")


def test_a_script_run_from_a_package_folder_counts_as_the_users():
    script = "/usr/lib/python3/dist-packages/trl/scripts/sft_test_only.py"
    assert not is_user_file(script)
    count_as_user(script)
    assert is_user_file(script)


def test_a_library_frame_is_named_from_its_package_folder_on():
    for folder in ("/usr/lib/python3/dist-packages", "/opt/venv/lib/python3.11/site-packages"):
        namespace: dict = {"library_frame": library_frame}
        exec(compile("def f():\n    return library_frame(1)\n", f"{folder}/somelib/mod.py", "exec"), namespace)
        assert namespace["f"]() == "somelib/mod.py:2"

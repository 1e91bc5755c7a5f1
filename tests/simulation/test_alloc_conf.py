import pytest

from xmem_engine.simulation.alloc_conf import AllocatorConfig, AllocConfError, parse_alloc_conf

MB = 1 << 20


def test_defaults_are_pytorchs():
    cfg = parse_alloc_conf("")
    assert cfg.max_split_size == 2**64 - 1
    assert cfg.roundup_power2_divisions == [0] * 16
    assert not cfg.expandable_segments
    assert cfg.garbage_collection_threshold == 0.0
    assert cfg.max_non_split_rounding_size == 20 * MB


def test_all_keys_with_spaces():
    cfg = parse_alloc_conf(
        "max_split_size_mb:128, garbage_collection_threshold:0.6,expandable_segments:True,"
        " roundup_power2_divisions:4,max_non_split_rounding_mb:64"
    )
    assert cfg.max_split_size == 128 * MB
    assert cfg.garbage_collection_threshold == 0.6
    assert cfg.expandable_segments
    assert cfg.roundup_power2_divisions == [4] * 16
    assert cfg.max_non_split_rounding_size == 64 * MB


def test_roundup_list_form_first_entry_fills_lower_intervals():
    cfg = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:8]")
    # keys are MiB; index = log2(key): 256 -> 8, 512 -> 9; '>' fills from the last index on
    assert cfg.roundup_power2_divisions[:8] == [1] * 8
    assert cfg.roundup_power2_divisions[8] == 1
    assert cfg.roundup_power2_divisions[9:] == [8] * 7
    assert cfg.divisions_for(300 * MB) == 1
    assert cfg.divisions_for(600 * MB) == 8
    assert cfg.divisions_for(100) == 1


def test_roundup_list_middle_entries():
    cfg = parse_alloc_conf("roundup_power2_divisions:[1:4,64:8]")
    assert cfg.roundup_power2_divisions[0] == 4
    assert cfg.roundup_power2_divisions[1:6] == [0] * 5
    assert cfg.roundup_power2_divisions[6] == 8
    assert cfg.roundup_power2_divisions[7:] == [0] * 9


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("max_split_size_mb:20", "max_split_size_mb too small"),
        ("max_split_size_mb:abc", "'abc' is not an integer"),
        ("garbage_collection_threshold:1.0", "garbage_collection_threshold"),
        ("garbage_collection_threshold:0", "garbage_collection_threshold"),
        ("expandable_segments:yes", "True/False"),
        ("roundup_power2_divisions:3", "power of 2"),
        ("roundup_power2_divisions:[100:2]", "intervals have to be a power of 2"),
        ("roundup_power2_divisions:[256:3]", "power of 2 or 0"),
        ("roundup_power2_divisions:[256:2", "string ended"),
        ("backend:magic", "magic"),
        ("max_split_size_mb", "expected ':' after 'max_split_size_mb'"),
        ("expandable_segment:True", "Unrecognized CachingAllocator option: 'expandable_segment'"),
        ("expandable_segments:True;max_split_size_mb:128", "True/False"),
        ("expandable_segments:True max_split_size_mb:128", "True/False"),
        (",", "expected a key"),
    ],
)
def test_errors_name_the_bad_key_or_value(text, fragment):
    with pytest.raises(AllocConfError) as info:
        parse_alloc_conf(text)
    assert fragment in str(info.value)


def test_from_env_prefers_new_name():
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}
    cfg = AllocatorConfig.from_env(env)
    assert cfg.expandable_segments and cfg.max_split_size == 2**64 - 1
    assert AllocatorConfig.from_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}).max_split_size == 64 * MB

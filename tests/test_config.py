import pytest
import torch

from attnbook import config


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("true", True), ("off", False)])
def test_env_var_forces_size(monkeypatch, value, expected):
    monkeypatch.setenv("ATTNBOOK_FAST", value)
    assert config.fast() is expected
    assert config.pick("small", "full") == ("small" if expected else "full")


def test_default_follows_the_hardware(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_FAST", raising=False)
    assert config.fast() is (not torch.cuda.is_available())
    assert config.device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_bad_value_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_FAST", "maybe")
    with pytest.raises(ValueError, match="ATTNBOOK_FAST must be one of '1', '0' .*got 'maybe'"):
        config.fast()

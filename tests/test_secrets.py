"""cookbook/secrets.py: what counts as secret, and masking."""
from cookbook.secrets import MASK, is_secret_name, mask, masked_env, secret_values


def test_secret_names() -> None:
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "hf_token", "DB_PASSWORD"):
        assert is_secret_name(name)
    for name in ("VLLM_SKIP_WARMUP", "PT_HPU_LAZY_MODE", "PATH"):
        assert not is_secret_name(name)


def test_secret_values_and_mask() -> None:
    env = {"HF_TOKEN": "hf_secret_value_123", "PATH": "/usr/bin", "SHORT_KEY": "ab"}
    values = secret_values(env, flags={"api-key": "sk-abcdef", "port": 8000})
    assert values == ["hf_secret_value_123", "sk-abcdef"]
    assert mask("token hf_secret_value_123 and sk-abcdef", values) == f"token {MASK} and {MASK}"
    assert masked_env(env)["HF_TOKEN"] == MASK and masked_env(env)["PATH"] == "/usr/bin"


def test_scrubbed_logs_mask_records_at_any_level(monkeypatch, caplog) -> None:
    """papermill logs each kernel message at DEBUG; a traceback that printed a token must not reach a log."""
    import logging

    from cookbook.secrets import scrubbed_logs

    monkeypatch.setenv("HF_TOKEN", "hf_logged_secret_0123456789")
    logger = logging.getLogger("cookbook-test-scrubbed")
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        with scrubbed_logs(logger.name):
            logger.debug("content: %s", {"evalue": "planted failure with hf_logged_secret_0123456789"})
        assert not logger.filters  # given back
        logger.debug("after: %s", "hf_logged_secret_0123456789")
    during, after = caplog.records
    assert during.getMessage() == f"content: {{'evalue': 'planted failure with {MASK}'}}"
    assert "hf_logged_secret_0123456789" in after.getMessage()  # only inside the block

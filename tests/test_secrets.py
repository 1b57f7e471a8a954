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

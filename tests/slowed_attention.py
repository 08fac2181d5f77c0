"""The worked outside attention (``examples/my_attention.py``) made slower: it computes the same
result twice, so it returns the same output in about twice the time. The A/B tests of two
``--impl`` targets (``tests/test_ab_impl.py``) compare it with the plain one; it needs
``examples/`` on PYTHONPATH."""
from my_attention import attention as _plain


def attention(q, k, v, *, causal, scale):
    """``my_attention.attention``, computed twice (same shapes, dtypes and errors)."""
    _plain(q, k, v, causal=causal, scale=scale)
    return _plain(q, k, v, causal=causal, scale=scale)

"""Laws of tree attention (the ``tree_attention`` contract; claim SD-10)."""

"""Client wire formats: each parses its body into canonical types and renders them back."""

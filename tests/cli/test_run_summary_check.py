"""The output check of `eaglelab run` and `compare`: speculation against plain greedy decoding of the same prompt."""

from eaglelab.compare import output_difference


def test_identical_output_has_no_difference_to_tell() -> None:
    assert output_difference([[1, 2, 3]], [[1, 2, 3]], "bfloat16", 24) is None


def test_a_float32_difference_is_an_alarm_that_names_the_token() -> None:
    text, alarm = output_difference([[1, 2, 9, 4]], [[1, 2, 3, 4]], "float32", 4)
    assert alarm and "DIFFERS" in text and "token 3 of 4" in text


def test_a_bfloat16_drift_says_where_and_why_without_an_alarm() -> None:
    """In bf16 a verify rounds differently from one-token decodes: the H200's runs part from plain greedy after
    tens of tokens. The summary says how many matched, why, and how to check exactly; it is not an alarm."""
    text, alarm = output_difference([[5, 6, 7, 8, 1]], [[5, 6, 7, 2, 2]], "bfloat16", 24)
    assert not alarm
    assert text.startswith("the first 3 of 5 tokens match") and "bfloat16" in text and "24 tokens" in text
    assert "--dtype float32" in text


def test_the_earliest_parting_row_counts_and_a_shorter_row_parts_where_it_ends() -> None:
    text, _ = output_difference([[1, 2, 3], [1, 9, 3]], [[1, 2, 4], [1, 2, 3]], "float16", 8)
    assert text.startswith("the first 1 of 3 tokens")
    text, alarm = output_difference([[1, 2]], [[1, 2, 3]], "float32", 4)
    assert alarm and "token 3 of 3" in text

"""`eaglelab run` streams the answer to stdout; a status said meanwhile (a phase compiled or captured
lazily on its first use) gets a line of its own on stderr and never enters the answer."""

from __future__ import annotations

import io

from rich.console import Console

from eaglelab.cmd_run import StreamedAnswer


class Words:
    """A tokenizer whose token i is the i-th word of a fixed list."""

    words = ["The", " sky", " is", " blue", ".\n", "Yes"]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.words[i] for i in ids)


def consoles() -> tuple[Console, io.StringIO, Console, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return (Console(file=out, highlight=False, width=200), out,
            Console(file=err, highlight=False, width=200), err)


def test_a_status_said_mid_line_gets_its_own_line_on_stderr_and_the_answer_stays_whole():
    out_c, out, err_c, err = consoles()
    answer = StreamedAnswer(out_c, err_c)
    answer.say("converting the model ...")  # before any text: no blank line
    answer.tokenizer = Words()
    answer.stream(0, [0])
    answer.say("  compiled verify in 18.1 s")
    answer.stream(0, [1, 2])
    answer.stream(0, [3, 4])
    answer.say("  compiled accept in 0.2 s")  # the answer ended its line: nothing to end
    answer.stream(0, [5])
    assert out.getvalue() == "The sky is blue.\nYes"
    assert err.getvalue() == "converting the model ...\n\n  compiled verify in 18.1 s\n  compiled accept in 0.2 s\n"

"""The final answer of a free-form completion, for tasks whose prompts ask for a tagged answer.

Chat-prompted tasks (``task=gsm``, ``task=math_jsonl``, reasoning-gym with ``prompt_style=chat``) append
``CHAT_INSTRUCTION`` to the question and read the answer back with :func:`strict_answer`: the last
``<answer>…</answer>``, else the last "Answer:" line — and *nothing* otherwise (no credit for a bare
number somewhere in the text, which a policy could farm). :func:`numbers_equal` compares numeric
answers as numbers (``1,234`` = ``1234.0``).
"""

from __future__ import annotations

import re

CHAT_INSTRUCTION = "Give your final answer inside <answer></answer> tags."
# the chat template's own text (role markers, system prompt) comes on top of the question: allowance in tokens
CHAT_TEMPLATE_ALLOWANCE = 96
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_LINE = re.compile(r"answer\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(
    completion: str, numeric: bool = False, last_number: bool = False, strict: bool = False
) -> str | None:
    """The final answer in a free-form completion: the last ``<answer>…</answer>``, else what follows
    the last "Answer:" (first line), else — with ``last_number`` and a numeric answer — the last number
    in the text; else the whole completion, stripped (``strict``: None, i.e. no answer given).
    Numbers lose thousands separators.

    The task scores with ``strict=True``: reasoning-gym's gsm_symbolic verifier reads the *first*
    number of whatever it is given, and on a random tiny model (10 steps, 16 held-out prompts) that
    gave 6-19% held-out "success" from random characters — a reward a policy could farm.
    """
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        return tags[-1].strip()
    lines = _ANSWER_LINE.findall(completion)
    if lines:
        ans = lines[-1].strip().splitlines()[0].strip().rstrip(".")
        return ans.replace(",", "") if numeric else ans
    if numeric and last_number:
        nums = _NUMBER.findall(completion.replace(",", ""))
        if nums:
            return nums[-1]
    return None if strict else completion.strip()


def is_numeric(target: str) -> bool:
    """The target is one number (thousands separators allowed): its answer is compared as a number."""
    return bool(_NUMBER.fullmatch(target.strip().replace(",", "")))


def strict_answer(completion: str, target: str) -> str | None:
    """``extract_answer(strict=True)``, numeric when the target is a number: the answer the
    completion states in the asked-for format, or None when it states none (scores 0)."""
    return extract_answer(completion, numeric=is_numeric(target), strict=True)


def numbers_equal(answer: str, target: str) -> bool:
    """The first number of ``answer`` equals ``target`` as a number (separators dropped): the
    comparison reasoning-gym's gsm_symbolic verifier makes, without the package."""
    found = _NUMBER.search(answer.replace(",", ""))
    return found is not None and float(found.group(0)) == float(target.strip().replace(",", ""))

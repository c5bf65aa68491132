"""Prompt presets (the d1 / SPG <reasoning>/<answer> format, its reward on the <answer> span),
the system prompt, test-only file tasks, and task files read through the path layer."""

import hashlib
import json

import pytest

from dllm_rl.config import ConfigError
from dllm_rl.tasks import CharTokenizer, make_task
from dllm_rl.tasks import verifiers
from dllm_rl.tasks.base import check_options
from dllm_rl.tasks.prompts import D1_FORMAT, D1_SUDOKU, PROMPT_PRESETS, chat_prompt
from dllm_rl.train.context import build_context
from dllm_rl.train.validate import validate
from tests.helpers import tiny_run_config

GSM8K = {"question": "Tom has 20 apples and buys 22 more. How many now?",
         "answer": "20+22=42\n#### 42"}
MATH = {"problem": "What is $1/2 + 1/4$?", "answer": "\\frac{3}{4}"}
COUNTDOWN = {"nums": [3, 5, 7], "target": 22}
SUDOKU = {"puzzle": "0034341221404301", "solution": "1234341221434321"}


def _file(path, record):
  path.write_text(json.dumps(record) + "\n")
  return str(path)


def _one(tmp_path, name, record, **options):
  task = make_task(name, test_file=_file(tmp_path / f"{name}.jsonl", record), **options)
  return task, task.generate("test", -1, seed=0)[0]


# sha256 (first 16 hex digits) of each d1 template, checked once character for character
# against d1's diffu-grpo/data_utils.py @837888f (SYSTEM_PROMPT, SUDOKU_SYSTEM_PROMPT and the
# per-task f-strings): any edit of the prompt text changes them.
D1_TEMPLATE_SHA256 = {"countdown_jsonl": "3a923445984a145e", "gsm8k": "d49248593898dd73",
                      "math500": "20a6e0697bcfd530", "sudoku_jsonl": "c6d93305f07a0bb8"}


def test_d1_templates_are_pinned():
  assert D1_FORMAT == ("\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n"
                       "<answer>\n...\n</answer>\n")
  templates = PROMPT_PRESETS["d1"].templates
  assert {k: hashlib.sha256(v.encode()).hexdigest()[:16] for k, v in templates.items()} == (
      D1_TEMPLATE_SHA256)


def test_d1_prompts_are_d1s_training_prompts(tmp_path):
  _, ex = _one(tmp_path, "gsm8k", GSM8K, prompt_preset="d1")
  assert ex.prompt == D1_FORMAT + "\n\n" + GSM8K["question"]
  _, ex = _one(tmp_path, "math500", MATH, prompt_preset="d1")
  assert ex.prompt.startswith(D1_FORMAT + "\n\nYou are a math expert.")
  assert "Wrap the final answer in a \\boxed{}. \n\nWhat is $1/2 + 1/4$?" in ex.prompt
  _, ex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, prompt_preset="d1")
  assert ex.prompt.startswith(D1_FORMAT + "\nUsing only the numbers [3, 5, 7], create an "
                              "arithmetic expression that evaluates to exactly 22.")
  _, ex = _one(tmp_path, "sudoku_jsonl", SUDOKU, prompt_preset="d1")
  assert ex.prompt == D1_SUDOKU + "\n\nSolve the following Sudoku puzzle: 0034341221404301\n"


def test_d1_reward_reads_the_answer_tag(tmp_path):
  plain, ex = _one(tmp_path, "gsm8k", GSM8K)
  tagged, _ = _one(tmp_path, "gsm8k", GSM8K, prompt_preset="d1")
  assert tagged.answer_tag and not plain.answer_tag
  good = "<reasoning>\n20 + 22 = 42\n</reasoning>\n<answer>\n42\n</answer>"
  assert tagged.verify(ex, good).correct and plain.verify(ex, good).correct
  assert tagged.verify(ex, "<reasoning>20+22</reasoning><answer>\n42").correct  # unclosed
  no_tag = "The total is 42."
  assert plain.verify(ex, no_tag).correct
  assert tagged.verify(ex, no_tag).info["reason"] == "no <answer> tag"
  outside = "<answer>unsure</answer> but maybe 42"  # only the span counts
  assert plain.verify(ex, outside).correct and not tagged.verify(ex, outside).correct
  off, _ = _one(tmp_path, "gsm8k", GSM8K, prompt_preset="d1", answer_tag=False)
  assert off.verify(ex, no_tag).correct  # answer_tag=False overrides the preset


def test_d1_countdown_and_sudoku_read_the_last_closed_answer(tmp_path):
  """d1's extract_solution / extract_answer_sudoku (diffu-grpo/reward_func.py @837888f):
  re.findall(r"<answer>(.*?)</answer>")[-1], None (reward 0) without a closed pair."""
  cd, cex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, prompt_preset="d1")
  assert cd.verify(cex, "<reasoning>\n...\n</reasoning>\n<answer>\n3*5+7\n</answer>").correct
  r = cd.verify(cex, "<reasoning>\n...\n</reasoning>\n<answer>\n3*5+7")  # cut off: d1 gives 0
  assert r.reward == 0.0 and r.info["reason"] == "no closed <answer>...</answer>"
  assert cd.verify(cex, "<answer>3*5+7</answer> then <answer>3+5").correct  # last closed pair
  sd, sex = _one(tmp_path, "sudoku_jsonl", SUDOKU, prompt_preset="d1", reward="cell_accuracy")
  assert sd.verify(sex, "<answer>\n1234341221434321\n</answer>").reward == 1.0
  assert sd.verify(sex, "<answer>\n1234341221434321").reward == 0.0
  # without the preset the whole text (or an unclosed span) is still read
  plain, _ = _one(tmp_path, "countdown_jsonl", COUNTDOWN)
  assert plain.verify(cex, "<answer>3*5+7").correct


def test_d1_grades_the_whole_closed_span_a_nested_answer_tag_included(tmp_path):
  """d1's findall body of "<answer>x<answer>B</answer>" is "x<answer>B", graded whole: not an
  expression (0.1) and the digits of both parts (Sudoku); it was cut again at the inner tag."""
  cd, cex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, prompt_preset="d1")
  r = cd.verify(cex, "<answer>x<answer>3*5+7</answer>")
  assert (r.reward, r.correct) == (0.1, False)
  sd, sex = _one(tmp_path, "sudoku_jsonl", SUDOKU, prompt_preset="d1")
  # d1: digits "12" + "34..." -> "1234341221404301"[:16] after the pad: blanks 0, 1 right
  assert sd.verify(sex, "<answer>12<answer>34341221404301</answer>").reward == 0.5


def test_d1_math_reward_reads_the_last_boxed_answer_anywhere(tmp_path):
  """d1's correctness_reward_func_math (diffu-grpo/reward_func.py @837888f, line 242): the
  last \\boxed{} of the whole completion, tags or not; without one, 0 (its is_equiv on the
  whole text)."""
  math, mex = _one(tmp_path, "math500", MATH, prompt_preset="d1", verify_timeout=0)
  assert not math.answer_tag and math.needs_boxed
  assert math.verify(mex, "<answer>\n\\boxed{\\frac{3}{4}}\n</answer>").correct
  assert math.verify(mex, "so \\boxed{\\frac{3}{4}}").correct  # no tags: d1 reads it
  assert math.verify(mex, "<answer>\\boxed{1}</answer> \\boxed{\\frac{3}{4}}").correct
  assert not math.verify(mex, "\\boxed{\\frac{3}{4}}, so \\boxed{1}").correct  # the last counts
  r = math.verify(mex, "<answer>\n3/4\n</answer>")
  assert not r.correct and r.info["reason"] == "no \\boxed{} answer"
  plain, _ = _one(tmp_path, "math500", MATH, verify_timeout=0)
  assert plain.verify(mex, "The answer is $\\frac{3}{4}$.").correct  # without the preset


@pytest.mark.parametrize("preset", ["", "d1"])
def test_every_sft_target_earns_the_reward_it_trains_for(tmp_path, preset):
  """The SFT target is what the reward reads: under the d1 preset GSM8K, Countdown and Sudoku
  targets are d1's SFT format <reasoning>R</reasoning>\\n<answer>A</answer> (an untagged
  target scored 0 after SFT)."""
  countdown = {**COUNTDOWN, "solution": "3*5+7"}
  for name, record in (("gsm8k", GSM8K), ("countdown_jsonl", countdown),
                       ("sudoku_jsonl", SUDOKU), ("math500", MATH)):
    task, ex = _one(tmp_path, name, record, prompt_preset=preset, verify_timeout=0)
    assert task.verify(ex, ex.answer).correct, (name, ex.answer)
    assert task.verify(ex, ex.answer).reward == (1.0 if task.reward != "d1" else
                                                 task._d1_reward(ex, ex.answer, True))
    assert ex.answer.startswith("<reasoning>") == (task.answer_tag and name != "math500")
  task, ex = _one(tmp_path, "gsm8k", GSM8K, prompt_preset="d1")
  assert ex.answer == "<reasoning>20+22=42</reasoning>\n<answer>42</answer>"


def test_d1_sudoku_rewards_the_share_of_blank_cells_by_default(tmp_path):
  """d1 trains Sudoku on sudoku_reward_func (the share of blank cells filled right): the
  preset's default; without it, or with reward=solved given, 0/1."""
  half = "<answer>1234341221404301</answer>"  # 2 of the 4 blanks right, 2 still blank
  for options, reward, score in (({"prompt_preset": "d1"}, "cell_accuracy", 0.5),
                                 ({}, "solved", 0.0),
                                 ({"prompt_preset": "d1", "reward": "solved"}, "solved", 0.0)):
    task, ex = _one(tmp_path, "sudoku_jsonl", SUDOKU, **options)
    assert task.reward == reward and task.verify(ex, half).reward == score


def test_d1_countdown_gives_a_wrong_tagged_answer_the_format_score(tmp_path):
  """d1's and StableDRL's compute_score: 1.0 right, 0.1 for any other closed <answer> span
  (wrong value, other numbers, not an expression), 0 without one; off without the preset."""
  task, ex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, prompt_preset="d1")
  assert task.format_score == 0.1
  assert task.verify(ex, "<answer>3*5+7</answer>").reward == 1.0
  for wrong in ("<answer>3+5+7</answer>", "<answer>3*5+7+1</answer>", "<answer>no</answer>"):
    r = task.verify(ex, wrong)
    assert (r.reward, r.correct) == (0.1, False) and r.parsed is not None, wrong  # not malformed
  assert task.verify(ex, "<answer>3+5+7").reward == 0.0
  for options in ({}, {"prompt_preset": "d1", "format_score": 0.0}):
    task, ex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, **options)
    assert task.verify(ex, "<answer>3+5+7</answer>").reward == 0.0
  with pytest.raises(ValueError, match=r"format_score must be in \[0, 1\), got 1.5"):
    _one(tmp_path, "countdown_jsonl", COUNTDOWN, format_score=1.5)


@pytest.mark.parametrize("completion, score", [
    ("<answer>3*5+7</answer>", 1.0),
    ("<reasoning>\n...\n</reasoning>\n<answer>\n(7 + 3*5)\n</answer>\n", 1.0),
    ("<answer>3*5+7=22</answer>", 0.1),  # \d+ reads 22 too: [3, 5, 7, 22] is not [3, 5, 7]
    ("<answer>3*5+7 = 22</answer>", 0.1),
    ("<answer>x=3*5+7</answer>", 0.1),  # the right numbers, but a letter and '='
    ("<answer>3*5+7+5</answer>", 0.1),  # 5 twice: the multiset differs
    ("<answer>3*5</answer>", 0.1),  # 7 unused
    ("<answer>3+5+7</answer>", 0.1),  # evaluates to 15
    ("<answer>3*5+7", 0.0),  # no closed span
    ("3*5+7", 0.0),
])
def test_d1_countdown_reward_is_compute_score(tmp_path, completion, score):
  """d1's compute_score (reward_func.py @837888f; TinyZero's countdown.py), by hand: the last
  closed <answer> body, stripped; its integers (re \\d+) sorted must be the numbers sorted,
  else 0.1; only digits, + - * / ( ) . and whitespace, else 0.1; 1.0 iff |value - 22| < 1e-5,
  else 0.1; no closed span: 0. It is the d1 preset's default reward for countdown_jsonl."""
  task, ex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, prompt_preset="d1")
  assert task.reward == "d1"
  r = task.verify(ex, completion)
  assert (r.reward, r.correct, r.parsed is not None) == (score, score == 1.0, True), r.info
  assert task._d1_reward(ex, completion, r.correct) == score


def test_countdown_reward_verifier_keeps_the_lenient_reading(tmp_path):
  """reward="verifier" (the default without the preset) drops an answer's trailing "= value"
  (verifiers.countdown_reward, unchanged); reward="d1" without the preset is compute_score
  with its format_score 0.1; an unknown reward is named."""
  eq = "<answer>3*5+7=22</answer>"
  for options in ({}, {"prompt_preset": "d1", "reward": "verifier"}):
    task, ex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, **options)
    assert task.reward == "verifier" and task.verify(ex, eq).reward == 1.0
  assert verifiers.countdown_reward(eq, [3, 5, 7], 22).correct  # the checker itself, unchanged
  task, ex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, reward="d1")
  assert (task.format_score, task.verify(ex, eq).reward) == (0.1, 0.1)
  assert task.verify(ex, "<answer>3*5+7</answer>").reward == 1.0
  with pytest.raises(ValueError, match=r"reward must be one of \('verifier', 'd1'\)"):
    _one(tmp_path, "countdown_jsonl", COUNTDOWN, reward="exact")


def test_the_stabledrl_preset_is_its_math_prompt_graded_by_math_verify(tmp_path):
  """StableDRL @26ad014 (dataloaders/math.py): collate_fn_mixed appends its raw-string
  instruction, doubled backslashes as run, to the problem; reward_mixed grades the whole
  response by math-verify, ±1 (wrong_reward=-1 with rl.malformed_reward=-1)."""
  instruct = ("(Please put the final answer in \\\\boxed{} tag, i.e. $\\\\boxed{answer"
              " here}$)")
  gsm, ex = _one(tmp_path, "gsm8k", GSM8K, prompt_preset="stabledrl", wrong_reward=-1.0)
  assert ex.prompt == GSM8K["question"] + instruct and gsm.math_verify
  assert gsm.verify(ex, "20 + 22 = 42, so $\\boxed{42}$").reward == 1.0
  assert gsm.verify(ex, "$\\boxed{\\frac{84}{2}}$").correct  # math-verify, not GSM8K's parser
  assert gsm.verify(ex, "\\boxed{41}").reward == -1.0  # a wrong answer
  math, mex = _one(tmp_path, "math500", MATH, prompt_preset="stabledrl")
  assert mex.prompt == MATH["problem"] + instruct and math.wrong_reward == 0.0
  assert math.verify(mex, "$\\boxed{0.75}$").correct and math.verify(mex, "\\boxed{1}").reward == 0
  with pytest.raises(ValueError, match=r"wrong_reward must be in \[-1, 0\], got 2"):
    _one(tmp_path, "gsm8k", GSM8K, wrong_reward=2)


def test_a_wrong_reward_leaves_partial_and_format_credit_and_malformed_answers_alone(tmp_path):
  gsm, ex = _one(tmp_path, "gsm8k", GSM8K, wrong_reward=-1.0)
  assert gsm.verify(ex, "#### 41").reward == -1.0 and gsm.verify(ex, "#### 42").reward == 1.0
  r = gsm.verify(ex, "no number")  # malformed: rl.malformed_reward decides
  assert r.parsed is None and r.reward == 0.0
  # a JsonlTask option: the file tasks with options of their own take it too
  cd, cex = _one(tmp_path, "countdown_jsonl", COUNTDOWN, wrong_reward=-1.0)
  assert cd.verify(cex, "3+5+7").reward == -1.0
  sd, sex = _one(tmp_path, "sudoku_jsonl", SUDOKU, wrong_reward=-0.5)
  assert sd.verify(sex, "<answer>1234341221434312</answer>").reward == -0.5
  check_options("code", {"wrong_reward": -1.0})  # no "unknown option"


def test_d1_gsm8k_and_math_rewards_are_d1s_sums_as_run(tmp_path):
  """diffu_grpo_train.py @837888f: GSM8K trains on xmlcount + soft + strict format + int +
  correctness (2.0 on the exact text after ####), MATH on correctness 2.0 + 0.5 ×
  boxed_in_answer, whose "\\boxed" test is a backspace in d1's source (never found: 0.5)."""
  gsm, ex = _one(tmp_path, "gsm8k", GSM8K, prompt_preset="d1")
  assert gsm.reward == "d1" and ex.meta["hash_answer"] == "42"
  best = "<reasoning>\n20+22\n</reasoning>\n<answer>\n42\n</answer>\n"
  assert gsm.verify(ex, best).reward == 0.5 + 0.5 + 0.5 + 2.0  # soft needs one line: no 0.5
  assert gsm.verify(ex, "<reasoning>20+22</reasoning><answer>42</answer>").reward == 3.0
  r = gsm.verify(ex, "no tags, 42")  # malformed for this task, not for d1's sum
  assert (r.correct, r.parsed, r.reward) == (False, "", 0.0)
  assert gsm.verify(ex, "<answer>42.0</answer>").correct  # by value; d1: not its exact text
  assert gsm.verify(ex, "<answer>42.0</answer>").reward == 0.0
  assert make_task("gsm8k", test_file=_file(tmp_path / "g.jsonl", GSM8K)).reward == "verifier"
  math, mex = _one(tmp_path, "math500", MATH, prompt_preset="d1", verify_timeout=0)
  assert math.verify(mex, "<answer>\\boxed{\\frac{3}{4}}</answer>").reward == 2.0 + 0.75
  assert math.verify(mex, "so \\boxed{\\frac{3}{4}}").reward == 2.0 + 0.25
  assert math.verify(mex, "<answer>\\boxed{1}</answer>").reward == 0.75
  with pytest.raises(ValueError, match=r"reward must be one of \('verifier', 'd1'\), got 'x'"):
    _one(tmp_path, "math500", MATH, reward="x")
  with pytest.raises(ValueError, match=r"task 'countdown' got unknown option\(s\)"
                                       r" \['reward'\]"):  # the generated task: no such option
    make_task("countdown", reward="d1")


def test_preset_errors_are_named(tmp_path):
  path = _file(tmp_path / "g.jsonl", GSM8K)
  with pytest.raises(ValueError,
                     match=r"prompt_preset must be one of \['d1', 'stabledrl'\], got 'd2'"):
    make_task("gsm8k", test_file=path, prompt_preset="d2")
  with pytest.raises(ValueError, match="give prompt_preset or prompt_template, not both"):
    make_task("gsm8k", test_file=path, prompt_preset="d1", prompt_template="Q: {question}")


def test_chat_prompt_puts_the_system_prompt_first():
  tok = CharTokenizer()  # no chat template
  assert chat_prompt("1+2=", tok) == "1+2="
  assert chat_prompt("1+2=", tok, "Add.") == "Add.\n\n1+2="


def test_a_test_only_task_evaluates_but_does_not_train(tmp_path):
  """MATH-500 has a test file only: mode=eval validates, the training modes name the key."""
  path = _file(tmp_path / "math500.jsonl", MATH)
  task = make_task("math500", test_file=path)
  assert task.has_split("test") and not task.has_split("train")
  overrides = {"task.name": "math500", "task.options": {"test_file": path}}
  validate(tiny_run_config("eval", overrides))
  for mode in ("sft", "rl", "pipeline"):
    with pytest.raises(ConfigError, match=r"config\.task\.options\.train_file: task 'math500' "
                                          rf"has no train split .* mode={mode} trains on it"):
      validate(tiny_run_config(mode, overrides))


def test_task_files_are_read_through_the_path_layer(fake_gcs):
  with fake_gcs.open("bucket/data/gsm8k.jsonl", "w") as f:
    f.write(json.dumps(GSM8K) + "\n")
  task = make_task("gsm8k", test_file="gs://bucket/data/gsm8k.jsonl")
  assert task.generate("test", -1, seed=0)[0].meta["reference"] == "42"
  with pytest.raises(FileNotFoundError, match="'gs://bucket/data/none.jsonl' does not exist"):
    make_task("gsm8k", test_file="gs://bucket/data/none.jsonl")


def test_eval_context_of_a_test_only_task_carries_the_system_prompt(tmp_path):
  """mode=eval builds no train / validation split (none is needed, a test file is enough);
  data.system_prompt reaches the encoded prompts (no chat template: before a blank line)."""
  path = _file(tmp_path / "cd.jsonl", COUNTDOWN)
  config = tiny_run_config("eval", {"task.name": "countdown_jsonl",
                                    "task.options": {"test_file": path},
                                    "task.test_size": 1, "data.prompt_len": 160,
                                    "data.system_prompt": "Be brief."})
  ctx = build_context(validate(config), str(tmp_path / "work"))
  assert ctx.train.examples == [] and ctx.val.examples == [] and len(ctx.test.examples) == 1
  row = ctx.test.arrays["prompt_BP"][0][ctx.test.arrays["prompt_valid_BP"][0]]
  assert ctx.tokenizer.decode(row) == "Be brief.\n\n" + ctx.test.examples[0].prompt


def test_sft_needs_only_the_train_splits_answers_to_fit(tmp_path):
  """SFT trains on the train split's answers; validation and test are graded from their
  prompts alone. A test answer longer than data.completion_len stopped an SFT run with
  `error: config.data.completion_len: test split ...` (a longer completion_len than the
  training needs, for every evaluation); now only a train answer that does not fit does."""
  train = tmp_path / "train.jsonl"  # solutions of 3 characters (+ EOS fits 8)
  train.write_text("".join(json.dumps({"nums": [a, b], "target": a + b, "solution": f"{a}+{b}"})
                           + "\n" for a in range(1, 6) for b in range(1, 6)))
  test = tmp_path / "test.jsonl"  # solutions of 11 characters
  test.write_text("".join(json.dumps({"nums": [a, 2, 3, 4], "target": (a + 2) * 7,
                                      "solution": f"({a}+2)*(3+4)"}) + "\n" for a in range(5)))
  config = tiny_run_config("sft", {"task.name": "countdown_jsonl",
                                   "task.options": {"train_file": str(train),
                                                    "test_file": str(test)},
                                   "task.train_size": 20, "task.val_size": 4,
                                   "task.test_size": 4, "data.prompt_len": 160,
                                   "data.completion_len": 8, "data.batch_size": 2})
  ctx = build_context(validate(config), str(tmp_path / "work"))
  assert len(ctx.test.examples) == 4 and len(ctx.test.examples[0].answer) == 11
  long_train = tiny_run_config("sft", {**{f"task.{k}": v for k, v in config.task.items()},
                                       "task.options": {"train_file": str(test),
                                                        "test_file": str(train)},
                                       "task.train_size": 3, "task.val_size": 1,
                                       "data.prompt_len": 160, "data.completion_len": 8,
                                       "data.batch_size": 2})
  with pytest.raises(ConfigError, match=r"config\.data\.completion_len: train split"):
    build_context(validate(long_train), str(tmp_path / "work2"))

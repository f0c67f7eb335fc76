"""hsx's chat templates (`hsx chat-template`) against the references nobody here wrote:
transformers' apply_chat_template on real models' templates (tests/data/chat_templates, sources in
its SOURCES.md), and jinja2 itself, configured as transformers configures it, on templates that
exercise one feature each. Text must be equal byte for byte; where the reference raises, hsx must
fail too (naming a template line)."""
import json
import subprocess

import pytest

from conftest import HSX, ROOT

jinja2 = pytest.importorskip("jinja2")
from jinja2.ext import loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

TEMPLATES = ROOT / "tests" / "data" / "chat_templates"
TOKENIZER = ROOT / "tests" / "data" / "tokenizers" / "bpe_qwen2" / "tokenizer.json"
NAMES = sorted(p.name for p in TEMPLATES.iterdir() if p.is_dir())

SYSTEM = {"role": "system", "content": "You are terse."}
TOOL_CALL = {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                               "arguments": {"city": "Paris", "unit": "C"}}}]}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}},
                   "required": ["city"]}}}]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [SYSTEM, {"role": "user", "content": "Hello"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey."},
     {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hey again."}],
    [{"role": "user", "content": "Ünïcödé ✓ 日本語 🌍 \u200b"}, {"role": "assistant", "content": "é"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "  padded  \n"}, {"role": "assistant", "content": "\n\nspaced\t"}],
    [{"role": "user", "content": "quotes ' \" \\ {{ not a tag }} {% raw %}"}],
    [{"role": "user", "content": "line\r\nbreaks\rand\ttabs"}],
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "<think>\nadding\n</think>\n\n4"},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "Think"}, {"role": "assistant", "content": "ok", "reasoning_content": "because"}],
    [{"role": "user", "content": "Weather in Paris?"}, TOOL_CALL,
     {"role": "tool", "content": "{\"temperature\": 21}"}, {"role": "tool", "content": "sunny"}],
    [{"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": " part two "}]}],
    [{"role": "assistant", "content": "I start."}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "system", "content": [{"type": "text", "text": "list system"}]}, {"role": "user", "content": "u"}],
]
CASES = [(c, gen, None) for c in CONVERSATIONS for gen in (False, True)]
CASES += [(CONVERSATIONS[0], True, {"tools": TOOLS}), (CONVERSATIONS[11], True, {"tools": TOOLS}),
          (CONVERSATIONS[1], True, {"chat_template_kwargs": {"enable_thinking": False}}),
          (CONVERSATIONS[9], False, {"chat_template_kwargs": {"date_string": "01 Dec 2026"}})]


def hsx_render(model_dir, lines, tmp_path):
    """hsx chat-template over JSONL lines: one {"text"} or {"error"} per line."""
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = subprocess.run([HSX, "chat-template", "--model", str(model_dir), "--input", str(path)],
                         capture_output=True, text=True, timeout=60)
    if run.returncode != 0 and not run.stdout:  # the template itself failed to parse
        assert "chat template: line " in run.stderr, run.stderr
        return [{"error": run.stderr}] * len(lines)
    outputs = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(outputs) == len(lines), run.stderr
    return outputs


def hf_tokenizer(model_dir):
    """A transformers tokenizer with this template and the model's special tokens."""
    from transformers import PreTrainedTokenizerFast
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    specials = {k: v for k, v in config.items() if k.endswith("_token")}
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), **specials)
    jinja = model_dir / "chat_template.jinja"
    tokenizer.chat_template = jinja.read_text() if jinja.exists() else config["chat_template"]
    return tokenizer


def hf_render(tokenizer, messages, add_generation_prompt, extra):
    extra = extra or {}
    try:
        return {"text": tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                      tools=extra.get("tools"), **extra.get("chat_template_kwargs", {}))}
    except (jinja2.TemplateError, TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
        return {"error": repr(e)}


@pytest.mark.parametrize("name", NAMES)
def test_real_templates_match_apply_chat_template(name, tmp_path):
    pytest.importorskip("transformers")
    model_dir = TEMPLATES / name
    tokenizer = hf_tokenizer(model_dir)
    lines = [{"messages": m, "add_generation_prompt": gen, **(extra or {})} for m, gen, extra in CASES]
    outputs = hsx_render(model_dir, lines, tmp_path)
    rendered = 0
    for (messages, gen, extra), ours in zip(CASES, outputs):
        theirs = hf_render(tokenizer, messages, gen, extra)
        where = f"{name}: {json.dumps(messages)[:200]} add_generation_prompt={gen} {extra}"
        if "error" in theirs:
            assert "error" in ours, f"{where}: transformers raised {theirs['error']!r}, hsx rendered {ours}"
            assert "line " in ours["error"], ours
        else:
            assert ours == theirs, where
            rendered += 1
    assert rendered >= len(CASES) // 3, f"{name}: too few conversations rendered to compare"


def jinja2_render(source, variables):
    """jinja2 as transformers' _compile_jinja_template sets it up (its own function when
    transformers is installed: it adds the {% generation %} tag)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        compile_template = _compile_jinja_template
    except ImportError:
        compile_template = None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        template = compile_template(source) if compile_template else env.from_string(source)
        return {"text": template.render(**variables)}
    except jinja2.TemplateError as e:
        return {"error": str(e)}
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError, OverflowError) as e:
        return {"error": repr(e)}


# One Jinja feature (or an interplay of a few) each, with `data` and `messages` as variables.
FEATURES = [
    "{{ 'a' }}  {{ 'b' }}\n{% if true %}\n  x\n{% endif %}\n  {%- if true %} y {% endif -%}\n z \n",
    "  {% for i in [1, 2] %}\n    {{ i }}\n  {% endfor %}\n{# comment #}\n  {#- c -#}  done\n",
    "{%+ if true %}kept{% endif +%}\nnext\n{% if true -%}\n\n  trimmed{%- endif %}",
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/"
    "{{ loop.length }}{% if not loop.last %},{% endif %}{% endfor %}",
    "{% for x in [] %}no{% else %}empty{% endfor %}|{% for x in data.list if x > 1 %}{{ x }}{% endfor %}",
    "{% for x in data.list %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}"
    "{% endfor %}",
    "{% set ns = namespace(n=0, s='') %}{% for x in data.list %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}"
    "{% endfor %}{{ ns.n }} {{ ns.s }}{% set y = 1 %}{% for x in [1] %}{% set y = 2 %}{% endfor %}{{ y }}",
    "{{ data.text | trim }}|{{ data.text | upper }}|{{ data.text | lower }}|{{ data.text | length }}|"
    "{{ data.text | capitalize }}|{{ data.text | title }}|{{ data.text | replace('l', 'L') }}",
    "{{ data | tojson }}|{{ data.list | tojson(indent=2) }}|{{ data.nested | tojson(sort_keys=true) }}",
    "{{ data.list | first }} {{ data.list | last }} {{ data.list | join('-') }} {{ data.missing | default('d') }} "
    "{{ none | default('n', true) }} {{ data.list | length }} {{ data.list | string }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|"
    "{{ messages | rejectattr('role', 'eq', 'user') | list | length }}|"
    "{% for k, v in data.nested | items %}{{ k }}{{ v }}{% endfor %}",
    "{{ data.missing is defined }} {{ data.missing is undefined }} {{ none is none }} {{ 'a' is string }} "
    "{{ data is mapping }} {{ data.list is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 1 is number }} "
    "{{ data.list is sequence }} {{ 2 is eq 2 }} {{ 'x' is in 'xyz' }} {{ 6 is divisibleby 3 }}",
    "{{ 1 and 2 }} {{ 0 or 'x' }} {{ not 0 }} {{ 'a' in 'cat' }} {{ 3 not in data.list }} {{ 1 == 1.0 }} "
    "{{ 2 != 3 }} {{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ 'a' ~ 1 ~ none }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} "
    "{{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 - 4 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }}",
    "{{ data.list[0] }} {{ data.list[-1] }} {{ data.list[1:3] }} {{ data.list[::-1] }} {{ data.list[::2] }} "
    "{{ data.text[1:] }} {{ data.text[-2:] }} {{ data.text[::-1] }} {{ data['text'] }} {{ data.nested.a }} "
    "{{ data.list[10] is defined }} {{ 'é🌍x'[1] }} {{ 'é🌍x' | length }}",
    "{{ data.text.strip() }}|{{ data.text.lstrip() }}|{{ data.text.rstrip() }}|{{ 'xxaxx'.strip('x') }}|"
    "{{ data.text.startswith(' he') }}|{{ data.text.endswith('d ') }}|{{ 'a,b,,c'.split(',') }}|"
    "{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'ab'.upper() }}|{{ 'AB'.lower() }}|"
    "{{ 'hello world'.title() }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ data.nested.get('a') }}|"
    "{{ data.nested.get('zz', 'dflt') }}|{% for k, v in data.nested.items() %}{{ k }}={{ v }};{% endfor %}",
    "{{ [1, 'a', none, true, 1.5, {'k': [2]}] }} {{ {'a': 1} }} {{ (1, 2)[1] }} {{ \"it's\" }} {{ ['it\\'s'] }} "
    "{{ '\\n\\t' | tojson }} {{ 'é' | tojson }} {{ [] | tojson }} {{ {} | tojson }}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} "
    "{{ greet(name='c', punct='.') }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set block %}inner {{ a }}{% endset %}[{{ block }}]{{ 'yes' if a else 'no' }}"
    "{{ 'x' if false }}|{{ range(3) | list }}{{ range(1, 7, 2) | list }}",
    "{{ raise_exception('custom failure') }}",
    "{{ undefined_name.attribute }}",
    "{{ 1 + 'a' }}",
    "{% for x in data.list %}{{ x }}",
    "{{ data.list | unique | list }} {{ data.list | reverse | list }} {{ [3, 1, 2] | sort }} {{ 'abc' | reverse }} "
    "{{ -3 | abs }} {{ '42' | int }} {{ 'x' | int }} {{ '1.5' | float }} {{ 3 | float }} {{ 'a\\nb\\n\\nc' | indent(2) }} "
    "{{ 'a\\nb' | indent(2, true) }} {{ [1, 2] | sum if false else 0 }}",
    "{% for m in messages %}{{ loop.previtem is defined }}{{ loop.nextitem.role if loop.nextitem }}"
    "{{ loop.cycle('odd', 'even') }};{% endfor %}",
    "{{ 'A' }}{% generation %} gen {{ 1 }}{% endgeneration %}{{ dict(a=1, b='x') | tojson }}",
    "{{ strftime_now('%Y-%m') }} {{ strftime_now('%d %b') | length }}",
]
VARIABLES = {"data": {"list": [1, 2, 3, 4, 5], "text": " hello world ", "nested": {"b": 2, "a": 1}},
             "messages": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
                          {"role": "user", "content": "u2"}]}


@pytest.mark.parametrize("index", range(len(FEATURES)))
def test_features_match_jinja2(index, tmp_path):
    source = FEATURES[index]
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "chat_template.jinja").write_text(source)
    line = {"messages": VARIABLES["messages"], "chat_template_kwargs": {"data": VARIABLES["data"]}}
    ours = hsx_render(model_dir, [line], tmp_path)[0]
    theirs = jinja2_render(source, {**VARIABLES, "add_generation_prompt": False, "tools": None})
    if "error" in theirs:
        assert "error" in ours, f"jinja2 raised {theirs['error']}, hsx rendered {ours}"
        if "custom failure" in theirs["error"]:
            assert "line 1: custom failure" in ours["error"]
    else:
        assert ours == theirs, source


def test_template_errors_name_line_and_input_line(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "chat_template.jinja").write_text("ok\n{% if messages %}\n{{ messages[0].content + 1 }}\n{% endif %}")
    lines = [{"messages": [{"role": "user", "content": "x"}]}, {"messages": [{"role": 3, "content": "x"}]},
             {"messages": [{"role": "user", "content": 7}]}, {"messages": "nope"}, {"no": "messages"}]
    outputs = hsx_render(model_dir, lines, tmp_path)
    assert "input.jsonl:1: chat template: line 3: unsupported operand" in outputs[0]["error"]
    assert "input.jsonl:2: messages[0].role: expected a string" in outputs[1]["error"]
    assert "input.jsonl:3: messages[0].content: expected a string, null or an array" in outputs[2]["error"]
    assert "input.jsonl:4: messages: expected an array" in outputs[3]["error"]
    assert "expected {\"messages\": [...]}" in outputs[4]["error"]
    (model_dir / "chat_template.jinja").write_text("{% for x in y %}\n{{ x }\n")
    run = subprocess.run([HSX, "chat-template", "--model", str(model_dir), "--input", str(tmp_path / "input.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "chat template: line 2" in run.stderr, run.stderr


def test_no_template_is_a_clear_error(tmp_path):
    (tmp_path / "input.jsonl").write_text("{\"messages\": []}\n")
    run = subprocess.run([HSX, "chat-template", "--model", str(tmp_path), "--input", str(tmp_path / "input.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "no chat template" in run.stderr

#!/usr/bin/env python3
"""Flags pipelines that end in a reader which may stop early, in shell scripts that set pipefail.

    ci/lint-pipefail.py FILE...

Under `set -o pipefail` a pipeline fails when any of its commands fails. A reader that exits
before it has read everything (`grep -q`, `grep -m N`, `head`, `sed ...q`, `awk '...exit'`,
`read`) leaves its writer to die of SIGPIPE the next time it writes, and whether that happens
depends on timing: `ldd X | grep -q libmpi` failed once in two runs on a loaded machine and
told the user that nccl-tests had no MPI. Capture the output first (`out=$(cmd)`, then
`grep -q PAT <<<"$out"`), or use a reader that reads to the end (`sed -n 1p`, `grep -c`,
`awk 'NR == 1 {...}'`). shellcheck does not flag this.

One line per finding, `FILE:LINE: ...`; exit status 1 when there is one, 0 when none, 2 on
bad usage. Files that never set pipefail are skipped. A line may carry
`# lint-pipefail: ok <why>` to accept its pipeline (say why the writer cannot be cut off).

The scan is lexical, not a full shell parser: it follows quotes, comments, here-documents,
$( ) and $(( )), and looks at the command after each `|`. Pipelines inside quoted strings
(code for another shell, e.g. a guest's) are not looked at.
"""
import re
import sys

SUPPRESS = "lint-pipefail: ok"
# set -o pipefail, set -euo pipefail, set -eu -o pipefail, ...
SETS_PIPEFAIL = re.compile(r"^\s*set\s[^#\n]*-\w*o\s+pipefail\b", re.M)
# grep options that stop reading early: -q/--quiet/--silent (first match), -m/--max-count,
# -l/--files-with-matches (first match in each input).
GREP_EARLY_LONG = ("--quiet", "--silent", "--max-count", "--files-with-matches")
GREP_EARLY_SHORT = set("qml")
# grep's short options that take an argument: what follows them in a cluster is the argument.
GREP_ARG_SHORT = set("efmABCdD")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SED_QUIT = re.compile(r"(?:^|[;{}\n]|[0-9$/])\s*[qQ]\s*[0-9]*\s*(?:$|[;}\n])")


class Word:
    def __init__(self, text, line):
        self.text = text  # the word with quotes removed (substitutions kept as a marker)
        self.line = line


def tokenize(src):
    """Yields ('word', Word) and ('op', text, line) tokens of the code parts of a script.
    Quoted strings become part of words; $( ) is tokenized as code in place (its tokens are
    yielded inside a ('(', ')') pair); here-document bodies are skipped."""
    i, n, line = 0, len(src), 1
    heredocs = []  # terminators waiting for the end of the current line
    word, word_line = None, line

    def flush():
        nonlocal word
        if word is not None:
            w = Word(word, word_line)
            word = None
            return [("word", w)]
        return []

    def add(ch):
        nonlocal word, word_line
        if word is None:
            word, word_line = "", line
        word += ch

    while i < n:
        c = src[i]
        if c == "\\" and i + 1 < n:
            if src[i + 1] == "\n":
                line += 1
                i += 2
                continue
            add(src[i + 1])
            i += 2
            continue
        if c == "#" and word is None:
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "\n":
            yield from flush()
            yield ("op", "\n", line)
            line += 1
            i += 1
            for term, strip_tabs in heredocs:
                # Skip the body up to the terminator line.
                while i < n:
                    j = src.find("\n", i)
                    end = n if j < 0 else j
                    body_line = src[i:end]
                    i = end + 1
                    line += 1
                    if (body_line.lstrip("\t") if strip_tabs else body_line) == term:
                        break
            heredocs = []
            continue
        if c == "'":
            j = src.find("'", i + 1)
            j = n if j < 0 else j
            text = src[i + 1:j]
            add(text)
            line += text.count("\n")
            i = j + 1
            continue
        if c == '"':
            # Double quotes: text, except $( ) inside, which is code.
            i += 1
            add("")
            while i < n and src[i] != '"':
                if src[i] == "\\" and i + 1 < n:
                    add(src[i + 1])
                    if src[i + 1] == "\n":
                        line += 1
                    i += 2
                    continue
                if src.startswith("$((", i):
                    i, line = skip_arith(src, i, line)
                    add("$((...))")
                    continue
                if src.startswith("$(", i):
                    saved, saved_line = word, word_line
                    word = None
                    sub_tokens, i, line = substitution(src, i + 2, line)
                    yield ("op", "(", line)
                    yield from sub_tokens
                    yield ("op", ")", line)
                    word, word_line = saved + "$(...)", saved_line
                    continue
                if src[i] == "\n":
                    line += 1
                add(src[i])
                i += 1
            i += 1
            continue
        if src.startswith("$((", i) or (src.startswith("((", i) and word is None):
            # Arithmetic: its | is a bitwise or.
            i, line = skip_arith(src, i, line)
            add("$((...))")
            continue
        if src.startswith("${", i):
            # A parameter expansion: ${x//a|b/c} holds no pipe.
            j, depth = i + 2, 1
            while j < n and depth:
                depth += {"{": 1, "}": -1}.get(src[j], 0)
                j += 1
            add(src[i:j])
            i = j
            continue
        if src.startswith("$(", i) or c == "`":
            if c == "`":
                j = src.find("`", i + 1)
                j = n if j < 0 else j
                sub_tokens = list(tokenize(src[i + 1:j]))
                sub_tokens = [shift_line(t, line - 1) for t in sub_tokens]
                line += src[i + 1:j].count("\n")
                i = j + 1
            else:
                sub_tokens, i, line = substitution(src, i + 2, line)
            saved, saved_line = word, word_line
            word = None
            yield ("op", "(", line)
            yield from sub_tokens
            yield ("op", ")", line)
            word, word_line = (saved or "") + "$(...)", saved_line if saved is not None else line
            continue
        if src.startswith("<<<", i):
            yield from flush()
            yield ("op", "<<<", line)
            i += 3
            continue
        if src.startswith("<<", i):
            yield from flush()
            m = re.match(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2", src[i:])
            if m:
                heredocs.append((m.group(3), m.group(1) == "-"))
                i += m.end()
                continue
        if c in " \t":
            yield from flush()
            i += 1
            continue
        if c in "|&;()<>":
            yield from flush()
            two = src[i:i + 2]
            if two in ("||", "&&", ";;", ";&", "|&", ">>", "&>", ">&", "<&", "<>", ">|"):
                op, i = two, i + 2
            else:
                op, i = c, i + 1
            yield ("op", op, line)
            continue
        add(c)
        i += 1
    yield from flush()


def shift_line(token, by):
    if token[0] == "word":
        token[1].line += by
        return token
    return (token[0], token[1], token[2] + by)


def skip_arith(src, i, line):
    """i at '$((' or '(('; returns the index after the matching '))' and the line there."""
    i += 3 if src.startswith("$((", i) else 2
    depth = 2
    while i < len(src) and depth:
        if src[i] == "(":
            depth += 1
        elif src[i] == ")":
            depth -= 1
        elif src[i] == "\n":
            line += 1
        i += 1
    return i, line


def substitution(src, i, line):
    """i just after '$('; returns (tokens of the code up to the matching ')', index after it, line)."""
    depth, j, in_single, in_double = 1, i, False, False
    while j < len(src):
        ch = src[j]
        if ch == "\\" and not in_single:
            j += 2
            continue
        if ch == "'" and not in_double:
            in_single = not in_single
        elif ch == '"' and not in_single:
            in_double = not in_double
        elif not in_single and not in_double:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    break
        j += 1
    inner = src[i:j]
    tokens = [shift_line(t, line - 1) for t in tokenize(inner)]
    return tokens, j + 1, line + inner.count("\n")


def early_reader(words):
    """Why the command `words` (after a `|`) may stop reading early, else None."""
    k = 0
    while k < len(words) and (ASSIGNMENT.match(words[k]) or words[k] in ("command", "exec", "builtin", "{", "!")):
        k += 1
    if k >= len(words):
        return None
    cmd, args = words[k].rsplit("/", 1)[-1], words[k + 1:]
    if cmd in ("grep", "egrep", "fgrep", "zgrep", "rg"):
        for a in args:
            if a == "--":
                break
            if a.startswith("--"):
                if a.split("=", 1)[0] in GREP_EARLY_LONG:
                    return f"{cmd} {a} stops at the first match"
            elif a.startswith("-") and len(a) > 1:
                for letter in a[1:]:
                    if letter in GREP_EARLY_SHORT:
                        return f"{cmd} -{letter} stops at the first match"
                    if letter in GREP_ARG_SHORT:
                        break
        return None
    if cmd == "head":
        return "head stops after the first lines"
    if cmd == "read":
        return "read takes one line"
    if cmd == "sed":
        scripts, expect_script = [], False
        for a in args:
            if expect_script:
                scripts.append(a)
                expect_script = False
            elif a in ("-e", "--expression"):
                expect_script = True
            elif a.startswith("--expression="):
                scripts.append(a.split("=", 1)[1])
            elif not a.startswith("-") and not scripts:
                scripts.append(a)
        if any(SED_QUIT.search(s) for s in scripts):
            return "sed quits (q) before the end"
        return None
    if cmd in ("awk", "gawk", "mawk", "nawk"):
        program = next((a for a in args if not a.startswith("-")), "")
        if re.search(r"\bexit\b", strip_end_blocks(program)):
            return "awk exits before the end"
        return None
    return None


def strip_end_blocks(program):
    """The awk program without its END { ... } blocks (an exit there comes after all input)."""
    out, i = [], 0
    for m in re.finditer(r"\bEND\s*\{", program):
        if m.start() < i:
            continue
        out.append(program[i:m.start()])
        depth, j = 1, m.end()
        while j < len(program) and depth:
            depth += {"{": 1, "}": -1}.get(program[j], 0)
            j += 1
        i = j
    out.append(program[i:])
    return "".join(out)


COMMAND_ENDS = {"\n", ";", "&", "&&", "||", "|", "|&", "(", ")", ";;", ";&"}
REDIRECTIONS = {"<", ">", ">>", "<<<", "&>", ">&", "<&", "<>", ">|"}
# Words after which the next word starts a command.
KEYWORDS = {"then", "do", "else", "elif", "if", "while", "until", "{", "!", "time"}


def findings(src):
    """(line, message) for every pipe whose reader may stop early. Case patterns (a|b)) are
    told apart from pipes by following `case WORD in` ... `)` ... `;;` ... `esac`."""
    tokens = list(tokenize(src))
    lines = src.split("\n")
    out = []
    cases = []  # per open case: "subject" (before `in`), "pattern" (before `)`) or "body"
    at_start = True
    for t_i, tok in enumerate(tokens):
        if tok[0] == "word":
            w = tok[1].text
            if cases and cases[-1] == "subject":
                cases[-1] = "pattern" if w == "in" else "subject"
            elif cases and cases[-1] == "pattern":
                if w == "esac":
                    cases.pop()
            elif at_start and w == "case":
                cases.append("subject")
            at_start = w in KEYWORDS
            continue
        op = tok[1]
        if cases and cases[-1] == "pattern":
            if op == ")":
                cases[-1] = "body"
            continue
        if cases and cases[-1] == "body" and op in (";;", ";&"):
            cases[-1] = "pattern"
            continue
        at_start = op in COMMAND_ENDS
        if op not in ("|", "|&"):
            continue
        words, j = [], t_i + 1
        # A pipe at the end of a line continues on the next.
        while j < len(tokens) and tokens[j][0] == "op" and tokens[j][1] == "\n":
            j += 1
        while j < len(tokens) and not (tokens[j][0] == "op" and tokens[j][1] in COMMAND_ENDS):
            if tokens[j][0] == "word":
                words.append(tokens[j][1].text)
            elif tokens[j][1] in REDIRECTIONS:
                j += 1  # the redirection's target is not an argument
            j += 1
        why = early_reader(words)
        if not why:
            continue
        reader_line = next((tokens[k][1].line for k in range(t_i + 1, j) if tokens[k][0] == "word"), tok[2])
        if any(SUPPRESS in lines[ln - 1] for ln in {tok[2], reader_line} if 0 < ln <= len(lines)):
            continue
        out.append((tok[2], f"a pipeline ends in `{' '.join(words[:3])}` under pipefail: {why}; its writer "
                            f"may then die of SIGPIPE and fail the pipeline at random. Capture the output "
                            f"first (out=$(cmd); grep -q PAT <<<\"$out\") or read to the end"))
    return out


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    bad = 0
    for path in argv:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                src = f.read()
        except OSError as e:
            print(f"lint-pipefail: {path}: {e}", file=sys.stderr)
            return 2
        if not SETS_PIPEFAIL.search(src):
            continue
        for line, message in findings(src):
            print(f"{path}:{line}: {message}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

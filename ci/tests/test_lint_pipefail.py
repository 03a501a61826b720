"""ci/lint-pipefail.py: pipelines whose reader stops early, in scripts that set pipefail."""
import os
import subprocess
import unittest

import helpers

SCRIPT = os.path.join(helpers.CI, "lint-pipefail.py")
PIPEFAIL = "#!/usr/bin/env bash\nset -euo pipefail\n"


def lint(testcase, body, header=PIPEFAIL):
    """(exit status, stdout) of the lint over one script, s.sh, made of header + body."""
    path = os.path.join(helpers.tempdir(testcase), "s.sh")
    with open(path, "w", encoding="utf-8") as f:
        f.write(header + body)
    r = helpers.run(["python3", SCRIPT, path])
    return r.returncode, r.stdout


class TheHazard(unittest.TestCase):
    def test_an_early_reader_fails_the_pipeline_under_pipefail(self):
        # What the lint is for: `yes` writes forever, grep -q exits at the first line, yes
        # dies of SIGPIPE, and pipefail reports the pipeline as failed although grep matched.
        r = subprocess.run(["bash", "-c", "set -o pipefail; yes | grep -q y"], check=False)
        self.assertEqual(r.returncode, 141)
        r = subprocess.run(["bash", "-c", "set -o pipefail; yes | head -n1 >/dev/null"], check=False)
        self.assertEqual(r.returncode, 141)
        # Captured first, the same check cannot fail that way.
        r = subprocess.run(["bash", "-c", "set -o pipefail; out=$(seq 100000); grep -q 5 <<<\"$out\""], check=False)
        self.assertEqual(r.returncode, 0)


class Flags(unittest.TestCase):
    def assertFlagged(self, body, line, words):
        rc, out = lint(self, body)
        self.assertEqual(rc, 1, f"not flagged: {body!r}\n{out}")
        self.assertIn(f"s.sh:{line}: a pipeline ends in `{words}", out)

    def test_the_nccl_tests_mpi_check(self):
        # A real flake: ci/nccl-two-ranks.sh concluded "built without MPI".
        self.assertFlagged("if ! ldd \"$bin\" 2>/dev/null | grep -q 'libmpi'; then\n  exit 1\nfi\n", 3, "grep -q libmpi")

    def test_every_early_reader(self):
        cases = {
            "a | grep -qi x\n": "grep -qi x",
            "a | grep -Fq x\n": "grep -Fq x",
            "a | grep --quiet x\n": "grep --quiet x",
            "a | grep --silent x\n": "grep --silent x",
            "a | grep -m1 x\n": "grep -m1 x",
            "a | grep --max-count=1 x\n": "grep --max-count=1 x",
            "a | grep -l x\n": "grep -l x",
            "a | LC_ALL=C grep -q x\n": "LC_ALL=C grep -q",
            "a | head -n1\n": "head -n1",
            "a | head\n": "head",
            "a | /usr/bin/head -c4\n": "/usr/bin/head -c4",
            "a | sed -n '1p;q'\n": "sed -n 1p;q",
            "a | sed 1q\n": "sed 1q",
            "a | sed -e '/x/q'\n": "sed -e /x/q",
            "a | awk '{ print $1; exit }'\n": "awk { print $1; exit }",
            "a | read -r x\n": "read -r x",
            "a |& grep -q x\n": "grep -q x",
        }
        for body, words in cases.items():
            with self.subTest(body=body):
                self.assertFlagged(body, 3, words)

    def test_wherever_the_pipeline_is(self):
        self.assertFlagged("x=$(a | head -n1)\n", 3, "head -n1")
        self.assertFlagged("echo \"n: $(a | head -1)\"\n", 3, "head -1")
        self.assertFlagged("echo `a | head -1`\n", 3, "head -1")
        self.assertFlagged("f() { a | grep -q x || return 1; }\n", 3, "grep -q x")
        self.assertFlagged("a b \\\n  c | grep -q x\n", 4, "grep -q x")
        self.assertFlagged("a |\n  grep -q x\n", 3, "grep -q x")
        self.assertFlagged("case $1 in\n  -q|x) a | head -1 ;;\nesac\n", 4, "head -1")
        self.assertFlagged("cat <<EOF\nbody | head\nEOF\na | head\n", 6, "head")
        rc, out = lint(self, "a | grep -q x\n", header="#!/bin/bash\nset -eu -o pipefail\n")
        self.assertEqual(rc, 1, out)

    def test_exit_status_and_message(self):
        rc, out = lint(self, "a | head -n1\nb | grep -q x\n")
        self.assertEqual(rc, 1)
        self.assertEqual(len(out.splitlines()), 2, out)
        self.assertIn("SIGPIPE", out)
        self.assertIn("<<<", out)


class Accepts(unittest.TestCase):
    def assertClean(self, body, header=PIPEFAIL):
        rc, out = lint(self, body, header)
        self.assertEqual((rc, out), (0, ""), body)

    def test_readers_that_read_to_the_end(self):
        for body in ("a | grep -c x\n", "a | grep x\n", "a | grep -v x | tail -n1\n", "a | sed -n 1p\n",
                     "a | sed 's/q/x/'\n", "a | awk 'NR == 1 { print }'\n", "a | awk '{ s += $1 } END { print s; exit }'\n",
                     "a | grep -e q x\n", "a | tee f\n", "a | while read -r x; do :; done\n", "out=$(a); grep -q x <<<\"$out\"\n",
                     "grep -q x f || b\n", "[[ $a || $b ]] && grep -q x f\n"):
            with self.subTest(body=body):
                self.assertClean(body)

    def test_what_is_not_a_pipe(self):
        for body in ("case $1 in\n  -q|head) x ;;\n  a|grep) y ;;\nesac\n",
                     "echo 'a | head -1'\n", "echo \"a | grep -q x\"\n", "# a | head\n", "x=$(( a | b ))\n",
                     "(( a | b ))\n", "y=${x//|/ }\n", "cat <<'EOF'\na | head\nEOF\n", "cat <<-EOF\n\ta | head -1\n\tEOF\n"):
            with self.subTest(body=body):
                self.assertClean(body)

    def test_scripts_without_pipefail(self):
        self.assertClean("a | head -n1\n", header="#!/bin/sh\nset -eu\n")
        self.assertClean("a | head -n1\n", header="#!/bin/bash\n# set -o pipefail\n")

    def test_a_reasoned_exception(self):
        self.assertClean("printf 'a\\n' | head -n1  # lint-pipefail: ok printf's one line fits the pipe\n")

    def test_usage(self):
        r = helpers.run(["python3", SCRIPT])
        self.assertEqual(r.returncode, 2)
        r = helpers.run(["python3", SCRIPT, "/nonexistent/s.sh"])
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()

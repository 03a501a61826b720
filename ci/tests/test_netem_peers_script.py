"""ci/netem-peers.sh without namespaces: bad options exit 2, and a host that cannot run it
(not root, no `ip`, no network namespaces) gets one `SKIPPED:` line and exit 77, not a pass
and not a failure. The run itself needs root and is a step of ci/test.sh."""
import os
import stat
import tempfile
import unittest

import helpers

SCRIPT = os.path.join(helpers.CI, "netem-peers.sh")
SKIPPED = 77


def fake(directory, name, body):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class NetemPeersScript(unittest.TestCase):
    def setUp(self):
        self.bin = tempfile.mkdtemp(prefix="netem-peers-fakes-")

    def tearDown(self):
        for name in os.listdir(self.bin):
            os.unlink(os.path.join(self.bin, name))
        os.rmdir(self.bin)

    def script(self, *args):
        env = {"PATH": self.bin + os.pathsep + os.environ["PATH"]}
        return helpers.run(["bash", SCRIPT, *args], env=env, timeout=60)

    def test_help_and_bad_options(self):
        r = self.script("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("Usage: ci/netem-peers.sh", r.stdout)
        for args in (("--bogus",), ("--peers", "5"), ("--peers", "3", "--slow", "4"), ("--count", "x")):
            r = self.script(*args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertIn("netem-peers:", r.stderr, args)

    def test_not_root_skips_with_a_reason(self):
        fake(self.bin, "id", "echo 1000")
        r = self.script("--no-build")
        self.assertEqual((r.returncode, r.stdout.strip()), (SKIPPED, "netem-peers: SKIPPED: needs root (network namespaces, tc)"))

    def test_no_namespaces_skips_with_a_reason(self):
        fake(self.bin, "id", "echo 0")
        # `ip netns add` refused (a container without CAP_SYS_ADMIN); nothing else is reached.
        fake(self.bin, "ip", 'case "$1 $2" in "netns add") echo "mount: permission denied" >&2; exit 1 ;; esac; exit 0')
        fake(self.bin, "tc", "exit 0")
        r = self.script("--no-build")
        self.assertEqual(r.returncode, SKIPPED, (r.stdout, r.stderr))
        self.assertEqual(r.stdout.strip(), "netem-peers: SKIPPED: cannot create a network namespace (ip netns add)")

    def test_no_shaping_skips_with_a_reason(self):
        fake(self.bin, "id", "echo 0")
        fake(self.bin, "ip", "exit 0")
        fake(self.bin, "tc", 'case "$*" in *"qdisc add"*) exit 2 ;; esac; exit 0')
        r = self.script("--no-build")
        self.assertEqual(r.returncode, SKIPPED, (r.stdout, r.stderr))
        self.assertIn("netem-peers: SKIPPED: neither sch_netem nor sch_tbf", r.stdout)


if __name__ == "__main__":
    unittest.main()

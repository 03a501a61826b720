"""ci/cargo_artifacts.py: the paths of build outputs from cargo's own JSON report."""
import json
import os
import shutil
import sys
import unittest

import helpers

SCRIPT = os.path.join(helpers.CI, "cargo_artifacts.py")
LOCAL = "path+file:///src/mpib#0.1.0"


def artifact(name, kinds, filenames, executable=None, test=False, package_id=LOCAL):
    return {"reason": "compiler-artifact", "package_id": package_id, "target": {"name": name, "kind": kinds},
            "profile": {"test": test}, "filenames": filenames, "executable": executable, "fresh": True}


# What `cargo test --workspace --no-run` reports when the plugin is a dependency of another
# member's tests (the library stays in deps/) and the binary's test harness shares its name.
REPORT = [
    artifact("libc", ["lib"], ["/t/debug/deps/liblibc.rlib"], package_id="registry+https://x#libc@0.2.0"),
    artifact("build-script-build", ["custom-build"], ["/t/debug/build/mpib-1/build-script-build"]),
    artifact("mpib", ["cdylib", "rlib"], ["/t/debug/deps/libmpib.so", "/t/debug/deps/libmpib.rlib"]),
    artifact("mpib-perf", ["bin"], ["/t/debug/mpib-perf"], executable="/t/debug/mpib-perf"),
    artifact("mpib-perf", ["bin"], ["/t/debug/deps/mpib_perf-1"], executable="/t/debug/deps/mpib_perf-1", test=True),
    artifact("conformance", ["test"], ["/t/debug/deps/conformance-1"], executable="/t/debug/deps/conformance-1", test=True),
    artifact("netem_report", ["example"], ["/t/debug/examples/netem_report"], executable="/t/debug/examples/netem_report"),
    {"reason": "build-finished", "success": True},
]


class WithFakeCargo(unittest.TestCase):
    """$CARGO is a stand-in that records its arguments and prints a canned report."""

    def run_with(self, args, report=REPORT, exit_code=0):
        d = helpers.tempdir(self)
        fake = os.path.join(d, "cargo")
        with open(os.path.join(d, "report.json"), "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(m) + "\n" for m in report))
        with open(fake, "w", encoding="utf-8") as f:
            f.write(f"""#!{sys.executable}
import sys
open({os.path.join(d, "args")!r}, "w").write("\\n".join(sys.argv[1:]))
print("   Compiling mpib (stand-in)", file=sys.stderr)
sys.stdout.write(open({os.path.join(d, "report.json")!r}).read())
sys.exit({exit_code})
""")
        os.chmod(fake, 0o755)
        r = helpers.run([sys.executable, SCRIPT, *args], env={"CARGO": fake})
        args_file = os.path.join(d, "args")
        if not os.path.exists(args_file):
            return r, None
        with open(args_file, encoding="utf-8") as f:
            return r, f.read().split("\n")

    def test_each_kind_in_the_order_asked(self):
        r, cargo_args = self.run_with(["test:conformance", "cdylib:mpib", "bin:mpib-perf", "example:netem_report", "--",
                                       "test", "--workspace", "--no-run"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["/t/debug/deps/conformance-1", "/t/debug/deps/libmpib.so",
                                                 "/t/debug/mpib-perf", "/t/debug/examples/netem_report"])
        self.assertEqual(cargo_args, ["test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"])
        self.assertIn("Compiling", r.stderr, "cargo's progress reaches the user")

    def test_the_last_report_of_a_target_wins(self):
        later = artifact("mpib", ["cdylib", "rlib"], ["/t/debug/libmpib.rlib", "/t/debug/libmpib.so"])
        r, _ = self.run_with(["cdylib:mpib", "--", "build"], report=REPORT + [later])
        self.assertEqual(r.stdout, "/t/debug/libmpib.so\n")

    def test_a_test_harness_is_not_the_binary(self):
        report = [m for m in REPORT if not (m.get("target", {}).get("name") == "mpib-perf" and not m["profile"]["test"])]
        r, _ = self.run_with(["bin:mpib-perf", "--", "test", "--no-run"], report=report)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stdout, "")
        self.assertIn("reported no bin:mpib-perf", r.stderr)
        # What the report held, for the user: the local packages' targets only.
        self.assertIn("cdylib/rlib:mpib", r.stderr)
        self.assertNotIn("libc", r.stderr)
        self.assertNotIn("build-script-build", r.stderr)

    def test_missing_artifact(self):
        r, _ = self.run_with(["bin:mpib-perf", "test:nope", "--", "build"])
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stdout, "", "nothing half-printed for a script to misread")
        self.assertIn("reported no test:nope", r.stderr)

    def test_cargo_failing(self):
        r, _ = self.run_with(["bin:mpib-perf", "--", "build"], exit_code=101)
        self.assertEqual(r.returncode, 101)
        self.assertEqual(r.stdout, "")

    def test_usage(self):
        for args in (["bin:mpib-perf"], ["--", "build"], ["bin:mpib-perf", "--"], ["mpib-perf", "--", "build"],
                     ["dylib:mpib", "--", "build"], ["bin:", "--", "build"]):
            with self.subTest(args=args):
                r, cargo_args = self.run_with(args)
                self.assertEqual(r.returncode, 2)
                self.assertIn("usage: ci/cargo_artifacts.py", r.stderr)
                self.assertIsNone(cargo_args, "cargo is not run")


@unittest.skipUnless(shutil.which("cargo"), "no cargo")
class WithRealCargo(unittest.TestCase):
    def test_a_workspace_with_its_own_target_dir(self):
        # A workspace layout: the plugin at the root, its tool in a member. Built only as a
        # dependency of the member's binary, the library is not copied up out of deps/, and
        # CARGO_TARGET_DIR moves everything: a path guessed under target/ would be wrong twice.
        d = helpers.tempdir(self)
        files = {
            "Cargo.toml": '[workspace]\nmembers = ["tools"]\n\n[package]\nname = "plug"\nversion = "0.1.0"\n'
                          'edition = "2021"\n\n[lib]\ncrate-type = ["cdylib", "rlib"]\n',
            "src/lib.rs": "pub fn f() {}\n",
            "tools/Cargo.toml": '[package]\nname = "tools"\nversion = "0.1.0"\nedition = "2021"\n\n'
                                '[dependencies]\nplug = { path = ".." }\n',
            "tools/src/bin/tool.rs": "fn main() { plug::f() }\n",
        }
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, "ws", name)), exist_ok=True)
            with open(os.path.join(d, "ws", name), "w", encoding="utf-8") as f:
                f.write(text)
        target = os.path.join(d, "elsewhere")
        env = {"CARGO_TARGET_DIR": target, "CARGO_NET_OFFLINE": "true"}
        r = helpers.run([sys.executable, SCRIPT, "bin:tool", "cdylib:plug", "--", "build", "--workspace", "--bin", "tool"],
                        env=env, cwd=os.path.join(d, "ws"), timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        tool, lib = r.stdout.splitlines()
        self.assertEqual(tool, os.path.join(target, "debug", "tool"))
        self.assertEqual(lib, os.path.join(target, "debug", "deps", "libplug.so"))
        self.assertTrue(os.access(tool, os.X_OK) and os.path.isfile(lib))
        self.assertFalse(os.path.exists(os.path.join(target, "debug", "libplug.so")))


if __name__ == "__main__":
    unittest.main()

"""Make sure the browser tests have a Chromium: Debian's own package, installed with apt-get
when it is missing and we are root. Playwright's browser download is never used (it cannot
work offline or on Debian's libraries); the tests launch this Chromium via executable_path.

Exit status 0 when a working Chromium is on PATH, 1 otherwise (the Makefile ignores it: the
browser tests then skip and say why). TFS_NO_BROWSER_INSTALL=1: never install anything.
"""
import os
import shutil
import subprocess
import sys

import apt

CANDIDATES = ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]
# Without the recommends (upower, printers, notification daemon ...): Chromium and the fonts
# the screenshots need (a CJK font too: notebook 11 prints Chinese, which Chromium would
# otherwise draw as empty boxes). --no-install-recommends saves minutes and hundreds of MB.
CJK_FONT = "fonts-wqy-microhei"
PACKAGES = ["chromium", "fonts-liberation", "fonts-dejavu-core", CJK_FONT]


def has_cjk_font() -> bool:
    """fontconfig knows a font that covers Chinese."""
    try:
        r = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return bool(r.stdout.strip())


def found():
    env = os.environ.get("TFS_CHROMIUM")
    if env and (os.path.exists(env) or shutil.which(env)):
        return env
    return next((shutil.which(c) for c in CANDIDATES if shutil.which(c)), None)


def works(path):
    try:
        r = subprocess.run([path, "--headless", "--no-sandbox", "--version"], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def main():
    path = found()
    if path:
        if not has_cjk_font() and apt.may_install("ensure_browser", "a CJK font", "TFS_NO_BROWSER_INSTALL",
                                                  [CJK_FONT], ""):
            apt.install("ensure_browser", [CJK_FONT])
        if works(path):
            return 0
        print(f"ensure_browser: {path} is there but does not start", file=sys.stderr)
        return 1
    if not apt.may_install("ensure_browser", "Chromium", "TFS_NO_BROWSER_INSTALL", PACKAGES,
                           " (or set TFS_CHROMIUM=/path/to/chrome)"):
        return 1
    ok = apt.install("ensure_browser", PACKAGES)
    path = found()
    if not ok or not path or not works(path):
        print("ensure_browser: apt-get could not install a working Chromium", file=sys.stderr)
        return 1
    print(f"ensure_browser: {path} ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())

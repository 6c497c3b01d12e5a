"""The supervisor of an unsandboxed check (only with AWL_UNSAFE_UNSANDBOXED_CHECKS=1).

Run as ``python -I -S _supervise.py STATUS_FD ARGV...`` so nothing in the workspace or the
environment changes what it imports. On Linux it makes itself the subreaper of everything
the check starts, so a daemon that leaves the process group and the session is still its
descendant; when the check ends, or the desk sends SIGTERM at the timeout, it kills every
descendant and writes ``exit N``, ``signal N``, ``timeout`` or ``error TEXT``, then
``left N``, on the status pipe. Nothing here holds against a hostile check: that is what
the sandbox (awl.desk.sandbox) is for.
"""
# ruff: noqa
# mypy: ignore-errors
import os, signal, sys


def main():
    status, argv = int(sys.argv[1]), sys.argv[2:]
    os.set_inheritable(status, False)
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass
    class Stop(Exception):
        pass
    def stop(*_):
        raise Stop
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(write, (exc.strerror or str(exc)).encode("utf-8", "replace")[:500])
        os._exit(127)
    os.close(write)
    why = b""
    while True:
        chunk = os.read(read, 500)
        if not chunk:
            break
        why += chunk
    signal.signal(signal.SIGTERM, stop)
    me = os.getpid()
    def descendants():
        parents = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            return []
        for name in names:
            if name.isdigit():
                try:
                    with open("/proc/%s/stat" % name, "rb") as f:
                        parents[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    pass
        found, todo = [], [me]
        while todo:
            parent = todo.pop()
            kids = [p for p, pp in parents.items() if pp == parent]
            found += kids
            todo += kids
        return found
    result = ""
    try:
        _, code = os.waitpid(pid, 0)
        if os.WIFSIGNALED(code):
            result = "signal %d" % os.WTERMSIG(code)
        else:
            result = "exit %d" % os.WEXITSTATUS(code)
    except Stop:
        result = "timeout"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if why:
        result = "error " + why.decode("utf-8", "replace")
    left = set()
    for _ in range(200):
        alive = False
        for p in set(descendants()):
            try:
                os.kill(p, signal.SIGKILL)
                alive = True
                if p != pid:
                    left.add(p)
            except OSError:
                pass
        while True:
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if done == 0:
                break
        if not alive:
            break
    os.write(status, ("%s\nleft %d\n" % (result, len(left))).encode("utf-8", "replace"))


if __name__ == "__main__":
    main()

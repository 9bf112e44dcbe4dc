"""The case directory, written safely: every directory entered a component at a time and never
through a link, files replaced atomically, appends refused on a FIFO, a hard-linked file or
another user's file, and one writer per case directory (a flock'ed WRITER_LOCK that mih's C++
TrainerSession takes too). Issue 53's rules; see docs/evidence.md."""
import errno
import fcntl
import json
import os
import secrets
import socket
import stat

# In the case directory: flock'ed by its one writer for the writer's life (mih's C++
# TrainerSession takes the same file, so the two exclude each other too); it names the holder.
WRITER_LOCK = ".writer.lock"


def _make_own_directory(path):
    """Creates `path` component by component, refusing a link or a directory another user owns,
    or one every user can write without the sticky bit: what another user planted there would
    send the evidence elsewhere (issue 53). Raises PermissionError naming the component."""
    at = os.path.sep
    for part in os.path.abspath(path).split(os.path.sep):
        if not part:
            continue
        at = os.path.join(at, part)
        try:
            os.mkdir(at)
        except FileExistsError:
            pass
        st = os.lstat(at)
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.geteuid(), 0):
            raise PermissionError(f"mih_evidence: {at} is a symbolic link of uid {st.st_uid}, which would send the "
                                  f"evidence elsewhere; remove it, or write to another directory")
        _check_own_directory(os.stat(at), at)


def _check_own_directory(st, at):
    """Raises PermissionError, naming directory `at` (its stat `st`) and the fix, unless it is this
    user's or root's and no other user may write it, sticky (/tmp) excepted."""
    if st.st_uid not in (os.geteuid(), 0):
        raise PermissionError(f"mih_evidence: {at} belongs to uid {st.st_uid}, who could plant links or FIFOs "
                              f"in it; remove it, or write to a directory of yours")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise PermissionError(f"mih_evidence: {at} is writable by every user (mode {st.st_mode & 0o7777:04o}, no "
                              f"sticky bit); chmod o-w {at}, or write to another directory")


def _open_at(dir_fd, name, path, flags, kind):
    """os.open(name, flags | O_NOFOLLOW, dir_fd=dir_fd), its error naming `path` and what is
    there when it is not `kind` (a link, a FIFO without a reader)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as e:
        mode = os.lstat(name, dir_fd=dir_fd).st_mode if os.path.lexists(path) else 0
        what = ("it is a symbolic link, never followed" if stat.S_ISLNK(mode) else "it is a FIFO, not a regular file"
                if stat.S_ISFIFO(mode) else e.strerror)
        raise OSError(e.errno, f"mih_evidence: {path} is not {kind} of this writer's: {what}; remove it, or "
                               f"write to a new case directory") from None


def _lock_case_directory(path):
    """Takes `path`'s writer lock (WRITER_LOCK, opened O_NOFOLLOW, a file of this user's) and
    returns its descriptor, which holds it until closed (finish() or the process's exit).
    Raises BlockingIOError naming the directory and the holder while another writer has it."""
    lock = os.path.join(path, WRITER_LOCK)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise OSError(e.errno, f"mih_evidence: cannot open the writer lock {lock}: {e.strerror} (a link there is "
                               f"never followed); write to a new case directory") from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise PermissionError(f"mih_evidence: {lock} belongs to uid {os.fstat(fd).st_uid}, not to this user: "
                                  f"write to a new case directory")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise BlockingIOError(errno.EWOULDBLOCK, f"mih_evidence: {path} is being written by {holder!r} ({lock} is "
                                                 f"locked): one writer per case directory; wait for it to end, or "
                                                 f"write to another directory") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _held_by(path):
    """'; being written now by <holder>' while another writer holds `path`'s lock, else ''
    (the lock file is never created here)."""
    try:
        fd = os.open(os.path.join(path, WRITER_LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return ""
    except BlockingIOError:
        return f"; being written now by {os.pread(fd, 512, 0).decode('utf-8', 'replace').strip()!r}"
    finally:
        os.close(fd)


def _name_holder(fd):
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"mih-evidence.py pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)


class CaseFiles:
    """The files of one case directory (`dir`), as rank 0 or any rank writes them."""

    def __init__(self, case_dir):
        self.dir = case_dir

    def take(self):
        """Rank 0: makes the directory, takes its writer lock and returns the descriptor that
        holds it. Raises FileExistsError when the directory holds a run's evidence already and
        BlockingIOError, naming the holder, while another writer has it."""
        self._check_free()
        _make_own_directory(self.dir)
        # Looked at again under the lock: two writers could both have found it free.
        lock = _lock_case_directory(self.dir)
        try:
            self._check_free()
        except BaseException:
            os.close(lock)
            raise
        _name_holder(lock)
        return lock

    def _check_free(self):
        if os.path.exists(os.path.join(self.dir, "environment.json")):
            raise FileExistsError(f"{self.dir} holds a run's evidence already{_held_by(self.dir)}; write each run "
                                  f"to a new directory")

    def _enter(self, relative_dir):
        """A descriptor of subdirectory `relative_dir` of the case directory, made and entered a component
        at a time, never through a link, each checked (issue 53: a planted link `check` was followed)."""
        at = os.path.abspath(self.dir)
        if not os.path.isdir(at):  # a rank other than 0 (rank 0 made it)
            _make_own_directory(at)
        fd = os.open(at, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _check_own_directory(os.fstat(fd), at)
            for part in [p for p in relative_dir.split("/") if p]:
                at = os.path.join(at, part)
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                sub = _open_at(fd, part, at, os.O_RDONLY | os.O_DIRECTORY, "a directory")
                os.close(fd)
                fd = sub
                _check_own_directory(os.fstat(fd), at)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(self, relative, value):
        head, name = os.path.split(relative)
        dfd = self._enter(head)
        # A new file under a name nobody can guess, never through a link (issue 53); os.replace replaces a link.
        tmp = f"{name}.tmp.{os.getpid()}.{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(value, f, indent=2, allow_nan=False)
                    f.write("\n")
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                os.unlink(tmp, dir_fd=dfd)
                raise
        finally:
            os.close(dfd)

    def append(self, relative, value):
        head, name = os.path.split(relative)
        dfd = self._enter(head)
        path = os.path.join(os.path.abspath(self.dir), relative)
        try:
            # O_NONBLOCK: a FIFO planted there is refused below, never waited on (issue 53).
            fd = _open_at(dfd, name, path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, "a regular file")
        finally:
            os.close(dfd)
        with os.fdopen(fd, "a") as f:
            st = os.fstat(fd)
            why = ("it is a FIFO, not a regular file" if stat.S_ISFIFO(st.st_mode) else
                   "it is not a regular file" if not stat.S_ISREG(st.st_mode) else
                   f"it belongs to uid {st.st_uid}, not to this user" if st.st_uid != os.geteuid() else
                   f"it has {st.st_nlink} hard links" if st.st_nlink != 1 else "")
            if why:  # a second name: another user may have hard-linked it (fs.protected_hardlinks 0)
                raise PermissionError(f"mih_evidence: cannot append to {path}: {why}, so another user could read "
                                      f"or redirect the evidence; remove it, or write to a new case directory")
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            f.write(json.dumps(value, allow_nan=False, separators=(",", ":")) + "\n")


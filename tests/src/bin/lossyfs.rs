//! `lossyfs`: a FUSE filesystem that loses, at a power cut, every write not
//! made durable — the crash model of `tests/powercut.rs`.
//!
//! ```text
//! lossyfs SOURCE MOUNTPOINT IMAGE [--cut-at N] [--log FILE]
//! ```
//!
//! Serves, in memory, a copy of directory SOURCE at MOUNTPOINT. It keeps
//! beside the live tree what a disk would still hold after a power cut:
//! a file's bytes as of its last `fsync`/`fdatasync` (none before its
//! first: an empty file), a directory's entries as of its last `fsync`
//! (SOURCE as it was, before the first). Nothing else is durable: a
//! write, truncate, create, unlink, rename or link not followed by the
//! matching fsync is gone after the cut. This is the harshest loss a
//! POSIX filesystem may inflict (ext4, xfs and btrfs keep less than they
//! may lose), the model of redb's crash-testing backend and of
//! filesystems like LazyFS, here as a FUSE layer because this machine's
//! kernel has no device-mapper (dm-flakey, dm-log-writes) and FUSE works
//! as root without any.
//!
//! The power cut: with `--cut-at N`, the N-th mutating request (write,
//! truncate, create, mkdir, unlink, rmdir, rename, link, fsync, fsyncdir;
//! counted from 1) is never carried out: the durable state as it is then
//! is written to the directory IMAGE, the file IMAGE/.cut is created, and
//! every request from then on blocks, so the program using the mount can
//! do nothing more (the harness kills it, then this process). Without
//! `--cut-at` the filesystem runs until unmounted, then writes its
//! durable state to IMAGE all the same and prints the number of mutating
//! requests it served. A lookup of a name `.lossyfs-phase-NAME` (which
//! never exists) records "NAME <requests so far>" in the `--log` file:
//! the workload marks its phases so, and the harness picks its cuts
//! inside each.
//!
//! Not modelled: `O_TMPFILE` (FUSE refuses it, so the local engine's named
//! staging files are what runs here), extended attributes, symlinks,
//! special files, and writes that survive partly (a cut keeps every
//! fsynced byte and loses every other one; a real disk may also keep some
//! unsynced writes, which only makes it kinder).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

const TTL: Duration = Duration::ZERO;
const PHASE: &str = ".lossyfs-phase-";

struct Node {
    dir: bool,
    perm: u16,
    data: Vec<u8>,
    children: BTreeMap<OsString, u64>,
    mtime: SystemTime,
}

struct State {
    nodes: HashMap<u64, Node>,
    next: u64,
    /// What survives a power cut: file bytes as of their last fsync…
    durable_data: HashMap<u64, Vec<u8>>,
    /// …and directory entries as of their last fsync.
    durable_dirs: HashMap<u64, BTreeMap<OsString, u64>>,
    ops: u64,
    cut_at: Option<u64>,
    image: PathBuf,
    log: Option<PathBuf>,
}

struct LossyFs(Mutex<State>);

impl State {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.nodes.get(&ino)?;
        Some(FileAttr {
            ino: INodeNo(ino),
            size: n.data.len() as u64,
            blocks: (n.data.len() as u64).div_ceil(512),
            atime: n.mtime,
            mtime: n.mtime,
            ctime: n.mtime,
            crtime: n.mtime,
            kind: if n.dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: n.perm,
            nlink: if n.dir { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// Counts a mutating request; at the cut, writes the durable image and
    /// never returns.
    fn mutate(&mut self) {
        self.ops += 1;
        if self.cut_at == Some(self.ops) {
            self.write_image().expect("write the durable image");
            // Written whole under another name, then renamed: the test
            // polls for `.cut` and must never read it half-written.
            let part = self.image.join(".cut.part");
            std::fs::write(&part, self.ops.to_string()).expect("mark the cut");
            std::fs::rename(&part, self.image.join(".cut")).expect("mark the cut");
            loop {
                std::thread::park();
            }
        }
    }

    fn new_node(&mut self, dir: bool, perm: u16) -> u64 {
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(
            ino,
            Node {
                dir,
                perm,
                data: Vec::new(),
                children: BTreeMap::new(),
                mtime: SystemTime::now(),
            },
        );
        ino
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        let p = self.nodes.get(&parent).ok_or(Errno::ENOENT)?;
        if !p.dir {
            return Err(Errno::ENOTDIR);
        }
        p.children.get(name).copied().ok_or(Errno::ENOENT)
    }

    fn load(&mut self, ino: u64, dir: &Path) -> std::io::Result<()> {
        let mut durable = BTreeMap::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let meta = e.metadata()?;
            let perm = (meta.permissions().mode() & 0o7777) as u16;
            let child = self.new_node(meta.is_dir(), perm);
            if meta.is_dir() {
                self.load(child, &e.path())?;
            } else {
                let data = std::fs::read(e.path())?;
                self.durable_data.insert(child, data.clone());
                self.nodes.get_mut(&child).unwrap().data = data;
            }
            durable.insert(e.file_name(), child);
        }
        self.nodes.get_mut(&ino).unwrap().children = durable.clone();
        self.durable_dirs.insert(ino, durable);
        Ok(())
    }

    /// The durable tree, written out under `self.image`.
    fn write_image(&self) -> std::io::Result<()> {
        let _ = std::fs::remove_dir_all(&self.image);
        std::fs::create_dir_all(&self.image)?;
        self.write_dir(INodeNo::ROOT.0, &self.image)
    }

    fn write_dir(&self, ino: u64, path: &Path) -> std::io::Result<()> {
        let Some(entries) = self.durable_dirs.get(&ino) else {
            return Ok(()); // never synced: empty
        };
        for (name, child) in entries {
            let Some(n) = self.nodes.get(child) else {
                continue;
            };
            let p = path.join(name);
            if n.dir {
                std::fs::create_dir(&p)?;
                self.write_dir(*child, &p)?;
            } else {
                let bytes = self.durable_data.get(child).map_or(&[][..], |d| &d[..]);
                std::fs::write(&p, bytes)?;
            }
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(n.perm.into()))?;
        }
        Ok(())
    }
}

impl LossyFs {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Filesystem for LossyFs {
    fn destroy(&mut self) {
        let s = self.state();
        if s.cut_at.is_none() {
            s.write_image().expect("write the durable image");
            println!("{}", s.ops);
            let _ = std::io::stdout().flush();
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = self.state();
        if let Some(phase) = name.to_str().and_then(|n| n.strip_prefix(PHASE)) {
            if let Some(log) = &s.log {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .expect("open the phase log");
                writeln!(f, "{phase} {}", s.ops).expect("write the phase log");
            }
            return reply.error(Errno::ENOENT);
        }
        match s.child(parent.0, name) {
            Ok(ino) => reply.entry(&TTL, &s.attr(ino).unwrap(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.state();
        if !s.nodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        if size.is_some() || mode.is_some() {
            s.mutate();
        }
        let n = s.nodes.get_mut(&ino.0).unwrap();
        if let Some(size) = size {
            n.data.resize(size as usize, 0);
            n.mtime = SystemTime::now();
        }
        if let Some(mode) = mode {
            n.perm = (mode & 0o7777) as u16;
        }
        if let Some(t) = mtime {
            n.mtime = match t {
                TimeOrNow::SpecificTime(t) => t,
                TimeOrNow::Now => SystemTime::now(),
            };
        }
        reply.attr(&TTL, &s.attr(ino.0).unwrap());
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut s = self.state();
        match s.child(parent.0, name) {
            Ok(_) => return reply.error(Errno::EEXIST),
            Err(e) if e != Errno::ENOENT => return reply.error(e),
            Err(_) => {}
        }
        s.mutate();
        let ino = s.new_node(true, (mode & !umask & 0o7777) as u16);
        s.nodes
            .get_mut(&parent.0)
            .unwrap()
            .children
            .insert(name.to_owned(), ino);
        reply.entry(&TTL, &s.attr(ino).unwrap(), Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state();
        match s.child(parent.0, name) {
            Ok(ino) if s.nodes[&ino].dir => reply.error(Errno::EISDIR),
            Ok(_) => {
                s.mutate();
                s.nodes.get_mut(&parent.0).unwrap().children.remove(name);
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state();
        match s.child(parent.0, name) {
            Ok(ino) if !s.nodes[&ino].dir => reply.error(Errno::ENOTDIR),
            Ok(ino) if !s.nodes[&ino].children.is_empty() => reply.error(Errno::ENOTEMPTY),
            Ok(_) => {
                s.mutate();
                s.nodes.get_mut(&parent.0).unwrap().children.remove(name);
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state();
        let ino = match s.child(parent.0, name) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        match s.child(newparent.0, newname) {
            Ok(_) if flags.contains(RenameFlags::RENAME_NOREPLACE) => {
                return reply.error(Errno::EEXIST);
            }
            Ok(old) if s.nodes[&old].dir && !s.nodes[&old].children.is_empty() => {
                return reply.error(Errno::ENOTEMPTY);
            }
            Ok(old) if s.nodes[&old].dir != s.nodes[&ino].dir => {
                return reply.error(Errno::EISDIR);
            }
            Err(e) if e != Errno::ENOENT => return reply.error(e),
            _ => {}
        }
        s.mutate();
        s.nodes.get_mut(&parent.0).unwrap().children.remove(name);
        s.nodes
            .get_mut(&newparent.0)
            .unwrap()
            .children
            .insert(newname.to_owned(), ino);
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut s = self.state();
        if !s.nodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        match s.child(newparent.0, newname) {
            Ok(_) => return reply.error(Errno::EEXIST),
            Err(e) if e != Errno::ENOENT => return reply.error(e),
            Err(_) => {}
        }
        s.mutate();
        s.nodes
            .get_mut(&newparent.0)
            .unwrap()
            .children
            .insert(newname.to_owned(), ino.0);
        reply.entry(&TTL, &s.attr(ino.0).unwrap(), Generation(0));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut s = self.state();
        if !s.nodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        if flags.0 & libc::O_TRUNC != 0 {
            s.mutate();
            s.nodes.get_mut(&ino.0).unwrap().data.clear();
        }
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = self.state();
        match s.nodes.get(&ino.0) {
            Some(n) => {
                let start = (offset as usize).min(n.data.len());
                let end = (start + size as usize).min(n.data.len());
                reply.data(&n.data[start..end]);
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.state();
        if !s.nodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        s.mutate();
        let n = s.nodes.get_mut(&ino.0).unwrap();
        let end = offset as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[offset as usize..end].copy_from_slice(data);
        n.mtime = SystemTime::now();
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state();
        if !s.nodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        s.mutate();
        let n = &s.nodes[&ino.0];
        if n.dir {
            let entries = n.children.clone();
            s.durable_dirs.insert(ino.0, entries);
        } else {
            let data = n.data.clone();
            s.durable_data.insert(ino.0, data);
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().nodes.get(&ino.0) {
            Some(n) if n.dir => reply.opened(FileHandle(0), FopenFlags::empty()),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = self.state();
        let Some(n) = s.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let mut entries: Vec<(u64, FileType, OsString)> = vec![
            (ino.0, FileType::Directory, ".".into()),
            (ino.0, FileType::Directory, "..".into()),
        ];
        for (name, child) in &n.children {
            let kind = if s.nodes[child].dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            entries.push((*child, kind, name.clone()));
        }
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync(req, ino, fh, datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if self.state().nodes.contains_key(&ino.0) {
            reply.ok();
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.state();
        match s.child(parent.0, name) {
            Ok(_) if flags & libc::O_EXCL != 0 => return reply.error(Errno::EEXIST),
            Ok(ino) => {
                if flags & libc::O_TRUNC != 0 {
                    s.mutate();
                    s.nodes.get_mut(&ino).unwrap().data.clear();
                }
                let a = s.attr(ino).unwrap();
                return reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty());
            }
            Err(e) if e != Errno::ENOENT => return reply.error(e),
            Err(_) => {}
        }
        s.mutate();
        let ino = s.new_node(false, (mode & !umask & 0o7777) as u16);
        s.nodes
            .get_mut(&parent.0)
            .unwrap()
            .children
            .insert(name.to_owned(), ino);
        let a = s.attr(ino).unwrap();
        reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: lossyfs SOURCE MOUNTPOINT IMAGE [--cut-at N] [--log FILE]";
    if args.len() < 4 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let (mut cut_at, mut log) = (None, None);
    let mut rest = args[4..].iter();
    while let Some(a) = rest.next() {
        match (a.as_str(), rest.next()) {
            ("--cut-at", Some(n)) => cut_at = Some(n.parse().expect("--cut-at N")),
            ("--log", Some(f)) => log = Some(PathBuf::from(f)),
            _ => {
                eprintln!("{usage}");
                std::process::exit(2);
            }
        }
    }
    let mut state = State {
        nodes: HashMap::new(),
        next: INodeNo::ROOT.0 + 1,
        durable_data: HashMap::new(),
        durable_dirs: HashMap::new(),
        ops: 0,
        cut_at,
        image: PathBuf::from(&args[3]),
        log,
    };
    state.nodes.insert(
        INodeNo::ROOT.0,
        Node {
            dir: true,
            perm: 0o755,
            data: Vec::new(),
            children: BTreeMap::new(),
            mtime: SystemTime::now(),
        },
    );
    state
        .load(INodeNo::ROOT.0, Path::new(&args[1]))
        .expect("read SOURCE");
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("lossyfs".into()),
        MountOption::DefaultPermissions,
    ];
    if let Err(e) = fuser::mount(LossyFs(Mutex::new(state)), &args[2], &config) {
        eprintln!("lossyfs: cannot mount {}: {e}", args[2]);
        std::process::exit(1);
    }
}

//! A small reader for the kernel's BTF (vmlinux and split module BTF): just
//! what kdrop needs to find struct member offsets, enum values and function
//! prototypes at load time. Format: https://docs.kernel.org/bpf/btf.html
use std::sync::Arc;

use anyhow::{bail, ensure, Context as _, Result};

const MAGIC: u16 = 0xeb9f;

/// A type's kind, numbered as in BTF (`BTF_KIND_INT` is 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int = 1,
    Ptr,
    Array,
    Struct,
    Union,
    Enum,
    Fwd,
    Typedef,
    Volatile,
    Const,
    Restrict,
    Func,
    FuncProto,
    Var,
    Datasec,
    Float,
    DeclTag,
    TypeTag,
    Enum64,
}

impl Kind {
    fn from_raw(k: u32) -> Option<Self> {
        use Kind::*;
        Some(match k {
            1 => Int,
            2 => Ptr,
            3 => Array,
            4 => Struct,
            5 => Union,
            6 => Enum,
            7 => Fwd,
            8 => Typedef,
            9 => Volatile,
            10 => Const,
            11 => Restrict,
            12 => Func,
            13 => FuncProto,
            14 => Var,
            15 => Datasec,
            16 => Float,
            17 => DeclTag,
            18 => TypeTag,
            19 => Enum64,
            _ => return None,
        })
    }
}

/// One BTF type. `items` indexes `Btf::items` (members, enum values, params).
#[derive(Clone, Debug)]
struct Type {
    name_off: u32,
    kind: Kind,
    kind_flag: bool,
    vlen: u32,
    /// `size` for Int/Struct/Union/Enum/Float/Datasec, `type` otherwise.
    size_or_type: u32,
    /// Element type for arrays.
    array_elem: u32,
    items: u32,
}

/// A member, enum value or parameter: (name, type or low value, offset or high value).
#[derive(Clone, Copy, Debug)]
struct Item {
    name_off: u32,
    a: u32,
    b: u32,
}

#[derive(Debug)]
pub struct Btf {
    base: Option<Arc<Btf>>,
    /// Id of `types[0]`: 1 for vmlinux, base's last id + 1 for split BTF.
    first_id: u32,
    /// Offset of `strings[0]`: base's string size for split BTF.
    str_base: u32,
    types: Vec<Type>,
    items: Vec<Item>,
    strings: Vec<u8>,
}

/// Where a struct member lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub bit_offset: u32,
    pub bitfield_size: u32,
    pub type_id: u32,
}

impl Member {
    pub fn byte_offset(&self) -> Result<u32> {
        ensure!(
            self.bit_offset.is_multiple_of(8) && self.bitfield_size == 0,
            "member is a bitfield"
        );
        Ok(self.bit_offset / 8)
    }
}

impl Btf {
    pub fn parse(data: &[u8], base: Option<Arc<Btf>>) -> Result<Self> {
        ensure!(data.len() >= 24, "too short for a BTF header");
        let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]);
        let magic = u16_at(0);
        if magic != MAGIC {
            bail!("bad magic {magic:#x} (only little-endian BTF is supported)");
        }
        let u32_at = |o: usize| -> Result<u32> {
            let b = data.get(o..o + 4).context("truncated header")?;
            Ok(u32::from_le_bytes(b.try_into().unwrap()))
        };
        let hdr_len = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let section = |off: usize, len: usize| {
            hdr_len
                .checked_add(off)
                .and_then(|s| Some((s, s.checked_add(len)?)))
                .and_then(|(s, e)| data.get(s..e))
                .context("section out of bounds")
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();

        let (first_id, str_base) = match &base {
            Some(b) => (b.next_id(), b.str_base + b.strings.len() as u32),
            None => (1, 0),
        };
        let mut btf = Btf {
            base,
            first_id,
            str_base,
            types: Vec::new(),
            items: Vec::new(),
            strings,
        };
        btf.parse_types(type_data)?;
        Ok(btf)
    }

    fn parse_types(&mut self, d: &[u8]) -> Result<()> {
        let mut p = 0usize;
        let rd = |p: usize| -> Result<u32> {
            let b = d.get(p..p + 4).context("truncated type section")?;
            Ok(u32::from_le_bytes(b.try_into().unwrap()))
        };
        while p < d.len() {
            let name_off = rd(p)?;
            let info = rd(p + 4)?;
            let size_or_type = rd(p + 8)?;
            p += 12;
            let kind = Kind::from_raw((info >> 24) & 0x1f)
                .with_context(|| format!("unknown BTF kind {}", (info >> 24) & 0x1f))?;
            let vlen = info & 0xffff;
            let kind_flag = info >> 31 == 1;
            let items = self.items.len() as u32;
            let mut array_elem = 0;
            match kind {
                Kind::Int | Kind::Var | Kind::DeclTag => p += 4,
                Kind::Array => {
                    array_elem = rd(p)?;
                    let nelems = rd(p + 8)?;
                    self.items.push(Item {
                        name_off: 0,
                        a: nelems,
                        b: 0,
                    });
                    p += 12;
                }
                Kind::Struct | Kind::Union | Kind::Datasec | Kind::Enum64 => {
                    for _ in 0..vlen {
                        self.items.push(Item {
                            name_off: rd(p)?,
                            a: rd(p + 4)?,
                            b: rd(p + 8)?,
                        });
                        p += 12;
                    }
                }
                Kind::Enum | Kind::FuncProto => {
                    for _ in 0..vlen {
                        self.items.push(Item {
                            name_off: rd(p)?,
                            a: rd(p + 4)?,
                            b: 0,
                        });
                        p += 8;
                    }
                }
                Kind::Ptr
                | Kind::Fwd
                | Kind::Typedef
                | Kind::Volatile
                | Kind::Const
                | Kind::Restrict
                | Kind::Func
                | Kind::Float
                | Kind::TypeTag => {}
            }
            ensure!(p <= d.len(), "truncated type section");
            // vlen counts items only for the kinds that have them (for FUNC
            // it is the linkage): keep lookups within what was read.
            let vlen = match kind {
                Kind::Struct
                | Kind::Union
                | Kind::Datasec
                | Kind::Enum64
                | Kind::Enum
                | Kind::FuncProto => vlen,
                _ => 0,
            };
            self.types.push(Type {
                name_off,
                kind,
                kind_flag,
                vlen,
                size_or_type,
                array_elem,
                items,
            });
        }
        Ok(())
    }

    fn next_id(&self) -> u32 {
        self.first_id + self.types.len() as u32
    }

    fn ty(&self, id: u32) -> Option<(&Btf, &Type)> {
        if id < self.first_id {
            return self.base.as_deref()?.ty(id);
        }
        Some((self, self.types.get((id - self.first_id) as usize)?))
    }

    fn str_at(&self, off: u32) -> &str {
        if off < self.str_base {
            return self.base.as_deref().map_or("", |b| b.str_at(off));
        }
        let s = &self.strings[((off - self.str_base) as usize).min(self.strings.len())..];
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// Whether the string at `off` is `name`: bytes
    /// only, no UTF-8 check or length scan. `find` runs this over every type
    /// of vmlinux (~130k) per lookup, and kdrop's startup is dominated by it
    /// under emulation (2.4 s of a 6.1 guest's 7 s start with `str_at`).
    fn name_is(&self, off: u32, name: &[u8]) -> bool {
        let Some(at) = off.checked_sub(self.str_base) else {
            // A module's type may be named by a string of vmlinux.
            return self.base.as_deref().is_some_and(|b| b.name_is(off, name));
        };
        let s = self.strings.get(at as usize..).unwrap_or_default();
        s.starts_with(name) && s.get(name.len()).is_none_or(|&c| c == 0)
    }

    /// Item `i` of `t`, which must be one of this BTF's own types.
    fn item(&self, t: &Type, i: u32) -> Item {
        self.items[(t.items + i) as usize]
    }

    pub fn name(&self, id: u32) -> &str {
        self.ty(id).map_or("", |(b, t)| b.str_at(t.name_off))
    }

    pub fn kind(&self, id: u32) -> Option<Kind> {
        self.ty(id).map(|(_, t)| t.kind)
    }

    /// The first type called `name` of kind `kind`, searching this BTF and then its base.
    pub fn find(&self, name: &str, kind: Kind) -> Option<u32> {
        let own = self
            .types
            .iter()
            .position(|t| t.kind == kind && self.name_is(t.name_off, name.as_bytes()))
            .map(|i| self.first_id + i as u32);
        own.or_else(|| self.base.as_deref()?.find(name, kind))
    }

    /// [`skeleton`] of those of `wanted` (name, kind) this BTF has, each at
    /// its id here (the first of its name and kind, as [`Btf::find`] says);
    /// those it lacks are left out.
    pub fn skeleton_of(&self, wanted: &[(&str, Kind)]) -> Vec<u8> {
        let named: Vec<(u32, Kind, &str)> = wanted
            .iter()
            .filter_map(|&(name, kind)| Some((self.find(name, kind)?, kind, name)))
            .collect();
        skeleton(&named)
    }

    /// Skips typedefs and qualifiers.
    pub fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.ty(id) {
                Some((
                    _,
                    t @ Type {
                        kind:
                            Kind::Typedef
                            | Kind::Volatile
                            | Kind::Const
                            | Kind::Restrict
                            | Kind::TypeTag,
                        ..
                    },
                )) => id = t.size_or_type,
                _ => return id,
            }
        }
        id
    }

    /// Size in bytes of a (resolved) type.
    pub fn size_of(&self, id: u32) -> Option<u32> {
        self.size_of_at(id, 0)
    }

    fn size_of_at(&self, id: u32, depth: u32) -> Option<u32> {
        // Arrays of arrays nest a few deep; malformed BTF can loop.
        if depth > 16 {
            return None;
        }
        let id = self.resolve(id);
        let (b, t) = self.ty(id)?;
        match t.kind {
            Kind::Int | Kind::Struct | Kind::Union | Kind::Enum | Kind::Enum64 | Kind::Float => {
                Some(t.size_or_type)
            }
            Kind::Ptr => Some(8),
            Kind::Array => {
                let n = b.item(t, 0).a;
                self.size_of_at(t.array_elem, depth + 1)?.checked_mul(n)
            }
            _ => None,
        }
    }

    /// The type a pointer points to.
    pub fn pointee(&self, id: u32) -> Option<u32> {
        let (_, t) = self.ty(self.resolve(id))?;
        (t.kind == Kind::Ptr).then_some(t.size_or_type)
    }

    /// Members of a struct or union as (name, member).
    pub fn members(&self, id: u32) -> Vec<(&str, Member)> {
        let Some((b, t)) = self.ty(self.resolve(id)) else {
            return Vec::new();
        };
        if !matches!(t.kind, Kind::Struct | Kind::Union) {
            return Vec::new();
        }
        (0..t.vlen)
            .map(|i| {
                let it = b.item(t, i);
                let (bit_offset, bitfield_size) = if t.kind_flag {
                    (it.b & 0xff_ffff, it.b >> 24)
                } else {
                    (it.b, 0)
                };
                (
                    b.str_at(it.name_off),
                    Member {
                        bit_offset,
                        bitfield_size,
                        type_id: it.a,
                    },
                )
            })
            .collect()
    }

    /// A member by dotted path (`"nd_net.net"`), looking through anonymous
    /// structs and unions the way C does. Offsets add up along the path.
    pub fn member(&self, struct_id: u32, path: &str) -> Option<Member> {
        let mut cur = Member {
            bit_offset: 0,
            bitfield_size: 0,
            type_id: struct_id,
        };
        for part in path.split('.') {
            let m = self.find_member(cur.type_id, part, 0)?;
            cur = Member {
                bit_offset: cur.bit_offset + m.bit_offset,
                ..m
            };
        }
        Some(cur)
    }

    fn find_member(&self, id: u32, name: &str, depth: u32) -> Option<Member> {
        if depth > 8 {
            return None;
        }
        let members = self.members(id);
        if let Some((_, m)) = members.iter().find(|(n, _)| *n == name) {
            return Some(*m);
        }
        members
            .iter()
            .filter(|(n, _)| n.is_empty())
            .find_map(|(_, anon)| {
                let inner = self.find_member(anon.type_id, name, depth + 1)?;
                Some(Member {
                    bit_offset: anon.bit_offset + inner.bit_offset,
                    ..inner
                })
            })
    }

    /// (name, value) of every enumerator of an enum or enum64.
    pub fn enum_values(&self, id: u32) -> Vec<(&str, i64)> {
        let Some((b, t)) = self.ty(self.resolve(id)) else {
            return Vec::new();
        };
        (0..t.vlen)
            .filter_map(|i| {
                let it = b.item(t, i);
                let v = match t.kind {
                    Kind::Enum if t.kind_flag => i64::from(it.a as i32),
                    Kind::Enum => i64::from(it.a),
                    Kind::Enum64 => (i64::from(it.b) << 32) | i64::from(it.a),
                    _ => return None,
                };
                Some((b.str_at(it.name_off), v))
            })
            .collect()
    }

    /// Parameter type ids of a function prototype (through typedef/pointer).
    pub fn params(&self, id: u32) -> Option<Vec<u32>> {
        let mut id = self.resolve(id);
        if let Some(p) = self.pointee(id) {
            id = self.resolve(p);
        }
        let (b, t) = self.ty(id)?;
        // The prototype may live in another BTF (base or split) than the
        // function: its items are that BTF's.
        let (b, t) = if t.kind == Kind::Func {
            self.ty(t.size_or_type)?
        } else {
            (b, t)
        };
        if t.kind != Kind::FuncProto {
            return None;
        }
        Some((0..t.vlen).map(|i| b.item(t, i).a).collect())
    }

    /// A short C-ish name for a type: `struct sk_buff *`, `enum skb_drop_reason`, `void *`.
    pub fn type_name(&self, id: u32) -> String {
        self.type_name_at(id, 0)
    }

    fn type_name_at(&self, id: u32, depth: u32) -> String {
        if id == 0 {
            return "void".into();
        }
        // Pointers to pointers nest a few deep; malformed BTF can loop.
        let Some((_, t)) = self.ty(id).filter(|_| depth <= 16) else {
            return "?".into();
        };
        match t.kind {
            Kind::Ptr => format!("{} *", self.type_name_at(t.size_or_type, depth + 1)),
            Kind::Const | Kind::Volatile | Kind::Restrict | Kind::TypeTag => {
                self.type_name_at(t.size_or_type, depth + 1)
            }
            Kind::Struct => format!("struct {}", self.name(id)),
            Kind::Union => format!("union {}", self.name(id)),
            Kind::Enum | Kind::Enum64 => format!("enum {}", self.name(id)),
            _ => self.name(id).to_string(),
        }
    }
}

/// A BTF blob in which each of `named` (id, kind, name) is a type of that
/// kind and name at that id, and every other id up to the largest is an
/// unnamed `void *` (the smallest type there is, 12 bytes). The named types
/// refer to nothing (type 0, no parameters, no members).
///
/// For a reader that only finds types by name and kind and keeps their ids:
/// aya's attach lookups (`kdrop::probes::attach`). aya cannot be handed
/// only those ids, nor a BTF built entry by entry (its typed entries'
/// constructors are not public), but it parses such a blob in a few
/// milliseconds where the whole of vmlinux's BTF takes ~60 ms, after kdrop
/// has parsed it once already. Ids 0 and repeated ids are skipped.
pub fn skeleton(named: &[(u32, Kind, &str)]) -> Vec<u8> {
    let mut named: Vec<_> = named.iter().filter(|(id, _, _)| *id != 0).collect();
    named.sort_by_key(|(id, _, _)| *id);
    named.dedup_by_key(|(id, _, _)| *id);
    let last = named.last().map_or(0, |(id, _, _)| *id);
    let mut types = Vec::with_capacity(12 * last as usize);
    let mut strings = vec![0u8];
    let mut put = |name_off: u32, kind: Kind| {
        for v in [name_off, (kind as u32) << 24, 0] {
            types.extend_from_slice(&v.to_le_bytes());
        }
    };
    let mut next = 1;
    for &&(id, kind, name) in &named {
        for _ in next..id {
            put(0, Kind::Ptr);
        }
        put(strings.len() as u32, kind);
        strings.extend_from_slice(name.as_bytes());
        strings.push(0);
        next = id + 1;
    }
    let mut out = Vec::with_capacity(24 + types.len() + strings.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&[1, 0]); // version 1, no flags
    let (type_len, str_len) = (types.len() as u32, strings.len() as u32);
    // hdr_len, type_off, type_len, str_off, str_len
    for v in [24, 0, type_len, type_len, str_len] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&types);
    out.extend_from_slice(&strings);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds BTF blobs for tests, the way pahole lays them out.
    #[derive(Default)]
    pub struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
        base_strings: u32,
    }

    impl Builder {
        pub fn new() -> Self {
            Self {
                strings: vec![0],
                ..Default::default()
            }
        }

        /// A builder for split BTF on top of `base` (built from `base_builder`).
        pub fn split(base_builder: &Builder) -> Self {
            Self {
                base_strings: base_builder.strings.len() as u32,
                ..Default::default()
            }
        }

        pub fn s(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.base_strings + self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }

        fn w(&mut self, v: u32) {
            self.types.extend_from_slice(&v.to_le_bytes());
        }

        pub fn ty(&mut self, name: &str, kind: u32, vlen: u32, kflag: bool, st: u32) {
            let n = self.s(name);
            self.w(n);
            self.w((kind << 24) | vlen | if kflag { 1 << 31 } else { 0 });
            self.w(st);
        }

        pub fn int(&mut self, name: &str, size: u32) {
            self.ty(name, 1, 0, false, size);
            self.w(size * 8);
        }

        pub fn ptr(&mut self, to: u32) {
            self.ty("", 2, 0, false, to);
        }

        pub fn strukt(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) {
            self.ty(name, 4, members.len() as u32, false, size);
            for (n, t, bits) in members {
                let n = self.s(n);
                self.w(n);
                self.w(*t);
                self.w(*bits);
            }
        }

        pub fn union(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) {
            self.ty(name, 5, members.len() as u32, false, size);
            for (n, t, bits) in members {
                let n = self.s(n);
                self.w(n);
                self.w(*t);
                self.w(*bits);
            }
        }

        pub fn enumeration(&mut self, name: &str, values: &[(&str, u32)]) {
            self.ty(name, 6, values.len() as u32, false, 4);
            for (n, v) in values {
                let n = self.s(n);
                self.w(n);
                self.w(*v);
            }
        }

        pub fn typedef(&mut self, name: &str, to: u32) {
            self.ty(name, 8, 0, false, to);
        }

        pub fn func_proto(&mut self, params: &[u32]) {
            self.ty("", 13, params.len() as u32, false, 0);
            for p in params {
                self.w(0);
                self.w(*p);
            }
        }

        pub fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.extend_from_slice(&[1, 0]);
            for v in [
                24u32,
                0,
                self.types.len() as u32,
                self.types.len() as u32,
                self.strings.len() as u32,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    /// A miniature vmlinux: an sk_buff with anonymous unions, like the real one.
    pub fn sample() -> (Builder, Vec<u8>) {
        let mut b = Builder::new();
        b.int("unsigned int", 4); // 1
        b.int("short unsigned int", 2); // 2
        b.struct_fwd_free(); // 3: struct net_device
        b.ptr(3); // 4: struct net_device *
        b.union("", 4, &[("mark", 1, 0), ("reserved_tailroom", 1, 0)]); // 5
        b.strukt(
            "",
            8,
            &[("protocol", 2, 0), ("network_header", 2, 16), ("", 5, 32)],
        ); // 6
        b.strukt("sk_buff", 32, &[("dev", 4, 0), ("", 6, 64)]); // 7
        b.enumeration(
            "skb_drop_reason",
            &[
                ("SKB_NOT_DROPPED_YET", 0),
                ("SKB_CONSUMED", 1),
                ("SKB_DROP_REASON_NOT_SPECIFIED", 2),
                ("SKB_DROP_REASON_IP_RPFILTER", 16),
            ],
        ); // 8
        b.ptr(7); // 9: struct sk_buff *
        b.ptr(0); // 10: void *
        b.func_proto(&[10, 9, 10, 8]); // 11
        b.ptr(11); // 12
        b.typedef("btf_trace_kfree_skb", 12); // 13
        let data = b.build();
        (b, data)
    }

    impl Builder {
        fn struct_fwd_free(&mut self) {
            self.strukt("net_device", 16, &[("ifindex", 1, 64)]);
        }
    }

    #[test]
    fn members_through_anonymous_unions() {
        let (_, data) = sample();
        let btf = Btf::parse(&data, None).unwrap();
        let skb = btf.find("sk_buff", Kind::Struct).unwrap();
        assert_eq!(skb, 7);
        let off = |p: &str| btf.member(skb, p).map(|m| m.byte_offset().unwrap());
        assert_eq!(off("dev"), Some(0));
        assert_eq!(off("protocol"), Some(8));
        assert_eq!(off("network_header"), Some(10));
        assert_eq!(off("mark"), Some(12));
        assert_eq!(off("nope"), None);
        let dev = btf.member(skb, "dev").unwrap();
        let nd = btf.pointee(dev.type_id).unwrap();
        assert_eq!(btf.member(nd, "ifindex").unwrap().byte_offset().unwrap(), 8);
        assert_eq!(
            btf.size_of(btf.member(skb, "mark").unwrap().type_id),
            Some(4)
        );
        assert_eq!(btf.type_name(dev.type_id), "struct net_device *");
    }

    #[test]
    fn enums_and_prototypes() {
        let (_, data) = sample();
        let btf = Btf::parse(&data, None).unwrap();
        let e = btf.find("skb_drop_reason", Kind::Enum).unwrap();
        let vals = btf.enum_values(e);
        assert_eq!(vals[3], ("SKB_DROP_REASON_IP_RPFILTER", 16));
        let tp = btf.find("btf_trace_kfree_skb", Kind::Typedef).unwrap();
        let params = btf.params(tp).unwrap();
        let names: Vec<_> = params.iter().map(|&p| btf.type_name(p)).collect();
        assert_eq!(
            names,
            [
                "void *",
                "struct sk_buff *",
                "void *",
                "enum skb_drop_reason"
            ]
        );
    }

    #[test]
    fn split_btf_sees_its_base() {
        let (base_b, data) = sample();
        let base = Arc::new(Btf::parse(&data, None).unwrap());
        let mut m = Builder::split(&base_b);
        m.strukt("nf_conn", 16, &[("mark", 1, 96)]); // id 14
        let module = Btf::parse(&m.build(), Some(base)).unwrap();
        let id = module.find("nf_conn", Kind::Struct).unwrap();
        assert_eq!(id, 14);
        assert_eq!(
            module.member(id, "mark").unwrap().byte_offset().unwrap(),
            12
        );
        // Base types and strings through the module.
        assert_eq!(module.find("sk_buff", Kind::Struct), Some(7));
        assert_eq!(module.name(1), "unsigned int");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(Btf::parse(&[], None).is_err());
        assert!(Btf::parse(&[0u8; 64], None).is_err());
        let (_, mut data) = sample();
        data.truncate(40);
        assert!(Btf::parse(&data, None).is_err());
        let (_, mut data) = sample();
        data[12] = 0xff; // type_len beyond the end
        assert!(Btf::parse(&data, None).is_err());
    }

    #[test]
    fn skeleton_keeps_ids_names_and_kinds() {
        let (_, data) = sample();
        let btf = Btf::parse(&data, None).unwrap();
        let wanted = [
            ("btf_trace_kfree_skb", Kind::Typedef),
            ("sk_buff", Kind::Struct),
            ("btf_trace_absent", Kind::Typedef),
            ("sk_buff", Kind::Struct), // asked twice
        ];
        let sk = Btf::parse(&btf.skeleton_of(&wanted), None).unwrap();
        assert_eq!(sk.find("btf_trace_kfree_skb", Kind::Typedef), Some(13));
        assert_eq!(sk.find("sk_buff", Kind::Struct), Some(7));
        assert_eq!(sk.find("btf_trace_absent", Kind::Typedef), None);
        // Placeholders below and between, nothing past the last.
        assert_eq!(sk.kind(1), Some(Kind::Ptr));
        assert_eq!(sk.name(1), "");
        assert_eq!(sk.kind(8), Some(Kind::Ptr));
        assert_eq!(sk.kind(14), None);
        // Empty: a valid BTF with no types.
        let none = Btf::parse(&skeleton(&[]), None).unwrap();
        assert_eq!(none.kind(1), None);
    }

    /// Inputs cargo fuzz (fuzz/fuzz_targets/btf.rs) found or would find:
    /// they parse, and every lookup on them answers without a panic or an
    /// endless recursion.
    #[test]
    fn malformed_types_do_not_panic_or_loop() {
        let mut b = Builder::new();
        b.ty("", 2, 6, false, 1); // 1: a pointer claiming 6 members, to itself
        b.ty("a", 3, 0, false, 0); // 2: an array of itself
        b.w(2);
        b.w(1);
        b.w(4);
        b.ty("f", 12, 0, false, 1); // 3: a function whose prototype is a pointer
        let btf = Btf::parse(&b.build(), None).unwrap();
        for id in 0..5 {
            assert!(btf.enum_values(id).is_empty());
            assert!(btf.members(id).is_empty());
            assert_eq!(btf.params(id), None);
            let _ = btf.size_of(id);
            let _ = btf.type_name(id);
        }
        assert_eq!(btf.size_of(2), None);
        assert!(
            btf.type_name(1).starts_with("? * *"),
            "{}",
            btf.type_name(1)
        );
    }
}

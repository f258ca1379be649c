package bpf_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
)

// The frames of the kernel-oracle test (oracle_test.go): a UDP/514
// datagram or a TCP SYN to 601/6514, each carrying an id (UDP: in its
// payload; TCP: in its sequence number), under random mutations of every
// layer. They are built byte by byte rather than with gopacket, because
// most of them are what gopacket will not write: lengths that disagree,
// checksums that are wrong, options and header chains in any order.

// oracleNet is the pair's addressing, which every frame is built for.
type oracleNet struct {
	collMAC, sendMAC []byte
	coll4, send4     netip.Addr
	coll6, send6     netip.Addr
}

// oracleCase is one datagram id and the frames that carry it.
type oracleCase struct {
	id     int
	kind   string   // the mutation's dimension, for the reverse report
	desc   []string // every mutation applied, for a failure
	tcp    bool
	seq    uint32 // a SYN's sequence number: its SYN-ACK acks seq + 1
	frames [][]byte
}

func (c *oracleCase) String() string {
	p := "udp"
	if c.tcp {
		p = "tcp-syn"
	}
	return fmt.Sprintf("id %d %s [%s] %s", c.id, p, c.kind, strings.Join(c.desc, ", "))
}

// oracleKinds are the mutation dimensions, one per case; each case may
// also take a few mutations of other dimensions (mixed).
var oracleKinds = []string{"plain", "l2", "dst", "src", "ip4opts", "ip4flags", "frag", "ext", "extfrag", "len", "csum", "tcp", "mac", "martian", "hbh"}

// mut is every choice that shapes one case's frames.
type mut struct {
	v6, tcp   bool
	dstMAC    []byte
	tags      []uint16 // VLAN TPIDs, outermost first
	vid       uint16
	src, dst  netip.Addr
	ttl       byte
	ip4opts   []byte
	ip4flags  uint16 // DF 0x4000, reserved 0x8000
	badIPCsum bool
	totDelta  int // added to the IPv4 total length or IPv6 payload length of every frame
	exts      [][]byte
	fragPos   int   // IPv6: the fragment header follows exts[:fragPos]; -1: not fragmented
	fragSizes []int // sizes of all fragments but the last, multiples of 8; nil: not fragmented
	fragOrder int   // 0 in order, 1 reversed, 2 last first
	udpLen    int   // added to the UDP length
	l4Csum    int   // 0 good, 1 bad, 2 zero (UDP)
	tcpFlags  byte
	tcpOpts   []byte
	tcpDoff   int // added to the data offset
	payload   int
	trailer   int // bytes after the IP datagram
}

var (
	macBroadcast = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	macMcast4    = []byte{0x01, 0x00, 0x5e, 0x00, 0x00, 0x01}
	macMcast6    = []byte{0x33, 0x33, 0x00, 0x00, 0x00, 0x01}
	macOther     = []byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x99}
)

func pick[T any](r *rand.Rand, vs ...T) T { return vs[r.IntN(len(vs))] }

// genCase draws the mutations of case id from r.
func genCase(r *rand.Rand, id int, n oracleNet) oracleCase {
	m := mut{v6: r.IntN(2) == 0, tcp: r.IntN(4) == 0, dstMAC: n.collMAC, ttl: 64, fragPos: -1, payload: 20 + r.IntN(200)}
	m.src, m.dst = n.send4, n.coll4
	if m.v6 {
		m.src, m.dst = n.send6, n.coll6
	}
	c := oracleCase{id: id, tcp: m.tcp, kind: pick(r, oracleKinds...)}
	mutate(r, &m, &c, c.kind)
	if c.kind != "plain" && !strictKinds[c.kind] && r.IntN(4) == 0 {
		k := pick(r, oracleKinds...)
		c.desc = append(c.desc, "and "+k+":")
		mutate(r, &m, &c, k)
	}
	c.desc = append([]string{map[bool]string{false: "ipv4", true: "ipv6"}[m.v6]}, c.desc...)
	if m.tcp {
		c.seq = 0x40000000 + uint32(id)
	}
	c.frames = m.build(n, c.id, c.seq)
	return c
}

// mutate applies one dimension's mutations to m, describing them in c.
func mutate(r *rand.Rand, m *mut, c *oracleCase, kind string) {
	d := func(f string, a ...any) { c.desc = append(c.desc, fmt.Sprintf(f, a...)) }
	switch kind {
	case "l2":
		m.dstMAC = pick(r, macBroadcast, macMcast4, macMcast6, macOther, m.dstMAC)
		d("dmac %x", m.dstMAC)
		for range r.IntN(4) {
			m.tags = append(m.tags, pick[uint16](r, 0x8100, 0x88a8))
		}
		m.vid = pick[uint16](r, 0, 0, 1, 42)
		m.trailer = pick(r, 0, 0, 1, 18, 40)
		d("tags %x vid %d trailer %d", m.tags, m.vid, m.trailer)
	case "dst", "src":
		mutateAddr(r, m, kind, d)
	case "ip4opts":
		m.ip4opts = ip4Options(r)
		d("ip4 options % x", m.ip4opts)
	case "ip4flags":
		m.ip4flags = pick[uint16](r, 0x4000, 0x8000, 0xc000, 0x2000)
		m.ttl = pick[byte](r, 0, 1, 255)
		d("ip4 flags %#x ttl %d", m.ip4flags, m.ttl)
	case "frag", "extfrag":
		m.payload = 20 + r.IntN(600)
		if kind == "extfrag" || (m.v6 && r.IntN(2) == 0) {
			m.v6 = true
			m.src, m.dst = netip.MustParseAddr("2001:db8:51::2"), netip.MustParseAddr("2001:db8:51::1")
			m.exts = extChain(r, r.IntN(5))
			m.fragPos = r.IntN(len(m.exts) + 1)
			d("v6 exts %s frag at %d", extNames(m.exts), m.fragPos)
		}
		for range 1 + r.IntN(2) {
			m.fragSizes = append(m.fragSizes, 8*pick(r, 0, 1, 2, 3, 4, 5, 8, r.IntN(80)))
		}
		m.fragOrder = r.IntN(3)
		d("frag sizes %v order %d", m.fragSizes, m.fragOrder)
	case "ext":
		if !m.v6 {
			m.v6 = true
			m.src, m.dst = netip.MustParseAddr("2001:db8:51::2"), netip.MustParseAddr("2001:db8:51::1")
		}
		if r.IntN(2) == 0 {
			m.exts = cleanChain(r, 4+r.IntN(9))
		} else {
			m.exts = extChain(r, 1+r.IntN(11))
		}
		d("v6 exts %s", extNames(m.exts))
	case "len":
		switch r.IntN(3) {
		case 0:
			m.totDelta = pick(r, -1, 1, -8, 8, -20, -40, 100, -1000, 1000, 65535)
			d("ip length %+d", m.totDelta)
		case 1:
			m.udpLen = pick(r, -1, 1, -8, -9, 7, 100, 65535)
			m.tcpDoff = pick(r, -1, -5, 1, 5, 10)
			d("udp length %+d / tcp doff %+d", m.udpLen, m.tcpDoff)
		default:
			m.payload = pick(r, 16, 17, 23, 24, 25, 1400) // the id needs 16
			m.trailer = pick(r, 0, 3, 30)
			d("payload %d trailer %d", m.payload, m.trailer)
		}
	case "csum":
		m.badIPCsum = !m.v6 && r.IntN(2) == 0
		m.l4Csum = r.IntN(3)
		d("bad ip csum %v, l4 csum %d", m.badIPCsum, m.l4Csum)
	case "tcp":
		m.tcpFlags = pick[byte](r, 0x12, 0x03, 0x06, 0x0a, 0x22, 0xc2, 0x10)
		m.tcpOpts = pick(r, []byte{2, 4, 5, 0xb4}, []byte{1, 1, 1, 0}, []byte{2, 4, 5, 0xb4, 4, 2, 1, 1, 3, 3, 7, 0})
		d("tcp flags %#x opts % x", m.tcpFlags, m.tcpOpts)
	default:
		mutateHost(r, m, kind, d)
	}
}

// mutateAddr applies the dst or src dimension: addresses the host owns,
// shares, or does not, and martians.
func mutateAddr(r *rand.Rand, m *mut, kind string, d func(string, ...any)) {
	switch kind {
	case "dst":
		if m.v6 {
			m.dst = netip.MustParseAddr(pick(r, "ff02::1", "ff05::1:3", "ff02::99", "2001:db8:51::99", "::1", "2001:db8:77::1", "fe80::1"))
			if m.dst.IsMulticast() && r.IntN(2) == 0 {
				m.dstMAC = macMcast6
			}
		} else {
			m.dst = netip.MustParseAddr(pick(r, "198.51.100.255", "255.255.255.255", "224.0.0.1", "239.1.2.3", "198.51.100.99", "192.0.2.77", "127.0.0.1", "198.51.100.0"))
			if m.dst.IsMulticast() && r.IntN(2) == 0 {
				m.dstMAC = macMcast4
			} else if r.IntN(2) == 0 && !m.dst.IsLoopback() {
				m.dstMAC = macBroadcast
			}
		}
		d("dst %v dmac %x", m.dst, m.dstMAC)
	case "src":
		if m.v6 {
			m.src = netip.MustParseAddr(pick(r, "2001:db8:51::77", "2001:db8:99::5", "ff02::1", "::", "::1", "fe80::5"))
		} else {
			m.src = netip.MustParseAddr(pick(r, "198.51.100.77", "203.0.113.9", "224.0.0.5", "0.0.0.0", "127.0.0.1", "198.51.100.255", "255.255.255.255"))
		}
		d("src %v", m.src)
	}
}

// ip4Options is a block of IPv4 options padded to 4 bytes: NOPs, Router
// Alert, record route, a timestamp, or a broken one.
func ip4Options(r *rand.Rand) []byte {
	var o []byte
	for range 1 + r.IntN(3) {
		switch r.IntN(6) {
		case 0:
			o = append(o, 1, 1, 1, 1)
		case 1:
			o = append(o, 0x94, 4, 0, 0) // Router Alert
		case 2:
			o = append(o, 7, 11, 4, 0, 0, 0, 0, 0, 0, 0, 0, 1) // record route, NOP pad
		case 3:
			o = append(o, 0x44, 12, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0) // timestamp
		case 4:
			o = append(o, 0x99, 0, 0, 0) // a length of 0: broken
		default:
			o = append(o, 0x88, 4, 0, 1) // stream id
		}
	}
	if len(o) > 40 {
		o = o[:40]
	}
	for len(o)%4 != 0 {
		o = append(o, 0)
	}
	return o
}

// IPv6 extension header kinds (their next-header numbers).
const (
	extHBH  = 0
	extRt   = 43
	extFrag = 44
	extAH   = 51
	extDst  = 60
)

// extChain is n extension headers of random kinds and lengths, each with
// its own next-header number in byte 0 (set by build) and its kind in a
// trailing tag that build strips: kind is the header's last byte + 1.
func extChain(r *rand.Rand, n int) [][]byte {
	var hs [][]byte
	for range n {
		var h []byte
		kinds := []int{extDst, extDst, extDst, extRt, extRt, extFrag, extFrag, extAH}
		if len(hs) == 0 {
			kinds = append(kinds, extHBH, extHBH, extHBH)
		} else if r.IntN(8) == 0 {
			kinds = append(kinds, extHBH) // not first: the kernel discards it
		}
		switch kind := pick(r, kinds...); kind {
		case extHBH, extDst:
			words := pick(r, 0, 0, 1, 2, 7, r.IntN(32))
			h = make([]byte, 8*(words+1))
			h[1] = byte(words)
			// One option fills the header: PadN (Linux takes at most 7
			// bytes of padding), an unknown option to skip (0x1e), one to
			// discard (0x5e), or a jumbo payload (0xc2).
			opt := pick[byte](r, 0x1e, 0x1e, 0x1e, 0x1e, 1, 0x5e, 0xc2)
			if opt == 1 && len(h) > 8 {
				opt = 0x1e
			}
			h[2], h[3] = opt, byte(len(h)-4)
			if opt == 0xc2 { // jumbo payload: 4 bytes of data
				h[3] = 4
				binary.BigEndian.PutUint32(h[4:], 70000)
				if len(h) > 8 {
					h[8], h[9] = 1, byte(len(h)-10)
				}
			}
			h = append(h, byte(kind))
		case extRt:
			words := pick(r, 0, 2, 4)
			h = make([]byte, 8*(words+1))
			h[1], h[2], h[3] = byte(words), pick[byte](r, 0, 0, 0, 2, 4, 253), pick[byte](r, 0, 0, 0, 0, 0, 1)
			h = append(h, byte(kind))
		case extAH:
			words := pick(r, 1, 2, 3, 5) // (len + 1) * 8 bytes, len = words*2 + ... as AH counts 4-byte words - 2
			size := 8 * (words + 1)
			h = make([]byte, size)
			h[1] = byte(size/4 - 2)
			binary.BigEndian.PutUint32(h[4:], 0x100)
			h = append(h, byte(kind))
		case extFrag:
			h = make([]byte, 8) // atomic: offset 0, no more fragments
			binary.BigEndian.PutUint32(h[4:], r.Uint32())
			h = append(h, byte(kind))
		}
		hs = append(hs, h)
	}
	return hs
}

// cleanChain is n extension headers that Linux walks and accepts:
// destination options holding one option to skip, type-0 routing headers
// with no segments left, and atomic fragment headers.
func cleanChain(r *rand.Rand, n int) [][]byte {
	var hs [][]byte
	for range n {
		words := pick(r, 0, 0, 1, 3, r.IntN(32))
		h := make([]byte, 8*(words+1))
		h[1] = byte(words)
		kind := pick[byte](r, extDst, extDst, extRt, extFrag)
		switch kind {
		case extDst:
			h[2], h[3] = 0x1e, byte(len(h)-4)
		case extFrag:
			h = h[:8]
			h[1] = 0
			binary.BigEndian.PutUint32(h[4:], r.Uint32())
		}
		hs = append(hs, append(h, kind))
	}
	return hs
}

func extNames(hs [][]byte) string {
	names := map[byte]string{extHBH: "hbh", extDst: "dst", extRt: "rt", extAH: "ah", extFrag: "frag"}
	var s []string
	for _, h := range hs {
		k := h[len(h)-1]
		s = append(s, fmt.Sprintf("%s/%d", names[k], len(h)-1))
		if k == extHBH || k == extDst {
			s[len(s)-1] += fmt.Sprintf("(opt %#x)", h[2])
		}
	}
	return "[" + strings.Join(s, " ") + "]"
}

// csum16 is the Internet checksum of b, starting from sum.
func csum16(sum uint32, b []byte) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// pseudo is the sum of the pseudo-header for proto and length n.
func (m *mut) pseudo(proto byte, n int) uint32 {
	var b []byte
	b = append(b, m.src.AsSlice()...)
	b = append(b, m.dst.AsSlice()...)
	b = append(b, 0, proto, byte(n>>8), byte(n))
	if m.v6 {
		b = append(b, 0, 0)
	}
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	return s
}

// l4 is the UDP datagram or TCP segment, checksummed as mutated.
func (m *mut) l4(id int, seq uint32) (proto byte, b []byte) {
	if m.tcp {
		opts := m.tcpOpts
		b = make([]byte, 20+len(opts))
		binary.BigEndian.PutUint16(b[0:], uint16(30000+id%30000))
		binary.BigEndian.PutUint16(b[2:], []uint16{601, 6514}[id%2])
		binary.BigEndian.PutUint32(b[4:], seq)
		doff := (20+len(opts))/4 + m.tcpDoff
		b[12] = byte(doff&0xf) << 4
		b[13] = 0x02
		if m.tcpFlags != 0 {
			b[13] = m.tcpFlags
		}
		binary.BigEndian.PutUint16(b[14:], 65535)
		copy(b[20:], opts)
		c := csum16(m.pseudo(6, len(b)), b)
		if m.l4Csum != 0 {
			c ^= 0x5555
		}
		binary.BigEndian.PutUint16(b[16:], c)
		return 6, b
	}
	msg := fmt.Sprintf("oracle id=%07d;", id)
	pay := []byte(msg + strings.Repeat("x", max(0, m.payload-len(msg))))
	if m.payload < len(msg) {
		pay = pay[:m.payload]
	}
	b = make([]byte, 8+len(pay))
	binary.BigEndian.PutUint16(b[0:], uint16(30000+id%30000))
	binary.BigEndian.PutUint16(b[2:], 514)
	ulen := len(b) + m.udpLen
	binary.BigEndian.PutUint16(b[4:], uint16(ulen))
	copy(b[8:], pay)
	n := min(ulen&0xffff, len(b))
	c := csum16(m.pseudo(17, ulen&0xffff), b[:n])
	if c == 0 {
		c = 0xffff
	}
	switch m.l4Csum {
	case 1:
		c ^= 0x5555
	case 2:
		c = 0
	}
	binary.BigEndian.PutUint16(b[6:], c)
	return 17, b
}

// build is the case's frames: the datagram, fragmented as mutated, in the
// mutated order, each behind its Ethernet header and tags.
func (m *mut) build(n oracleNet, id int, seq uint32) [][]byte {
	proto, l4 := m.l4(id, seq)
	var ips [][]byte
	if m.v6 {
		ips = m.ipv6(proto, l4, uint32(id))
	} else {
		ips = m.ipv4(proto, l4, uint16(id))
	}
	switch {
	case m.fragOrder == 1:
		for i, j := 0, len(ips)-1; i < j; i, j = i+1, j-1 {
			ips[i], ips[j] = ips[j], ips[i]
		}
	case m.fragOrder == 2 && len(ips) > 1:
		ips = append([][]byte{ips[len(ips)-1]}, ips[:len(ips)-1]...)
	}
	etype := uint16(0x0800)
	if m.v6 {
		etype = 0x86dd
	}
	var frames [][]byte
	for _, ip := range ips {
		f := append(append([]byte{}, m.dstMAC...), n.sendMAC...)
		for _, tpid := range m.tags {
			f = binary.BigEndian.AppendUint16(f, tpid)
			f = binary.BigEndian.AppendUint16(f, m.vid)
		}
		f = binary.BigEndian.AppendUint16(f, etype)
		f = append(f, ip...)
		f = append(f, make([]byte, m.trailer)...)
		frames = append(frames, f)
	}
	return frames
}

// split cuts b at the fragment sizes: every piece but the last a multiple
// of 8; sizes past b's end are dropped.
func (m *mut) split(b []byte) (pieces [][]byte, offs []int) {
	off := 0
	for _, s := range m.fragSizes {
		if off+s >= len(b) {
			break
		}
		pieces, offs = append(pieces, b[off:off+s]), append(offs, off)
		off += s
	}
	return append(pieces, b[off:]), append(offs, off)
}

func (m *mut) ipv4(proto byte, l4 []byte, id uint16) [][]byte {
	pieces, offs := [][]byte{l4}, []int{0}
	if m.fragSizes != nil {
		pieces, offs = m.split(l4)
	}
	var out [][]byte
	for i, pc := range pieces {
		hl := 20 + len(m.ip4opts)
		h := make([]byte, hl, hl+len(pc))
		h[0] = 0x40 | byte(hl/4)
		binary.BigEndian.PutUint16(h[2:], uint16(hl+len(pc)+m.totDelta))
		binary.BigEndian.PutUint16(h[4:], id)
		fo := m.ip4flags | uint16(offs[i]/8)
		if i < len(pieces)-1 {
			fo |= 0x2000
		}
		binary.BigEndian.PutUint16(h[6:], fo)
		h[8], h[9] = m.ttl, proto
		copy(h[12:], m.src.AsSlice())
		copy(h[16:], m.dst.AsSlice())
		copy(h[20:], m.ip4opts)
		c := csum16(0, h)
		if m.badIPCsum {
			c ^= 0x0f0f
		}
		binary.BigEndian.PutUint16(h[10:], c)
		out = append(out, append(h, pc...))
	}
	return out
}

// chain joins extension headers, each pointing at the next, the last at
// next; it returns the first header's number and the bytes.
func chain(hs [][]byte, next byte) (byte, []byte) {
	var b []byte
	for i := len(hs) - 1; i >= 0; i-- {
		h := append([]byte{}, hs[i][:len(hs[i])-1]...)
		h[0] = next
		next = hs[i][len(hs[i])-1]
		b = append(h, b...)
	}
	return next, b
}

func (m *mut) ipv6(proto byte, l4 []byte, id uint32) [][]byte {
	hdr := func(next byte, pay []byte) []byte {
		h := make([]byte, 40, 40+len(pay))
		h[0] = 0x60
		binary.BigEndian.PutUint16(h[4:], uint16(len(pay)+m.totDelta))
		h[6], h[7] = next, m.ttl
		copy(h[8:], m.src.AsSlice())
		copy(h[24:], m.dst.AsSlice())
		return append(h, pay...)
	}
	if m.fragSizes == nil {
		next, ext := chain(m.exts, proto)
		return [][]byte{hdr(next, append(ext, l4...))}
	}
	pos := min(max(m.fragPos, 0), len(m.exts))
	fnext, frag := chain(m.exts[pos:], proto)
	frag = append(frag, l4...)
	pieces, offs := m.split(frag)
	var out [][]byte
	for i, pc := range pieces {
		fh := make([]byte, 8, 8+len(pc))
		fh[0] = fnext
		fo := uint16(offs[i])
		if i < len(pieces)-1 {
			fo |= 1
		}
		binary.BigEndian.PutUint16(fh[2:], fo)
		binary.BigEndian.PutUint32(fh[4:], id)
		unfrag := append(append([][]byte{}, m.exts[:pos]...), append(make([]byte, 0, 9), fh...))
		unfrag[len(unfrag)-1] = append(unfrag[len(unfrag)-1], extFrag)
		next, u := chain(unfrag, 0)
		u[len(u)-8] = fnext // chain set the fragment header's next to 0
		out = append(out, hdr(next, append(u, pc...)))
	}
	return out
}

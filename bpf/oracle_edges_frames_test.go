package bpf_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The frames of the structural generator (oracle_edges_test.go): a UDP/514
// datagram or a TCP SYN to 601 behind a header chain, with one or more of
// the length and offset fields the program reads set to an edge value,
// and checksums computed for each length the kernel may read.

// edgeEdit sets one field of a built frame to one edge value.
type edgeEdit struct {
	field string // ip4.tot, ip4.ihl, ip6.plen, ext.len, frag, udp.len, tcp.doff, vlan, vid
	ext   int    // ext.len: which extension header (0 = first)
	value string // zero, belowmin, min, rem-1, rem, rem+1, max, or a number
}

// edgeSpec is one frame of the generator: a family, a protocol, a header
// chain, a trailer and the edits.
type edgeSpec struct {
	v6, tcp bool
	chain   string
	trailer int
	edits   []edgeEdit
}

func (s edgeSpec) String() string {
	fam, proto := "ipv4", "udp/514"
	if s.v6 {
		fam = "ipv6"
	}
	if s.tcp {
		proto = "tcp/601 syn"
	}
	var e []string
	for _, ed := range s.edits {
		f := ed.field
		if f == "ext.len" {
			f = fmt.Sprintf("ext[%d].len", ed.ext)
		}
		e = append(e, f+"="+ed.value)
	}
	return fmt.Sprintf("%s %s chain %s trailer %d: %s", fam, proto, s.chain, s.trailer, strings.Join(e, " "))
}

// Header chains: IPv4 (none, IP options, AH) and IPv6, each a list of
// extension headers by kind. The hbh* chains hold a hop-by-hop header
// first with one option: PadN, an unknown option to skip (0x1e) or to
// discard (0x5e), or a Jumbo Payload.
var (
	edgeChains4 = []string{"none", "opts", "ah"}
	edgeChains6 = map[string][]string{
		"none": nil, "hbh": {"hbh"}, "hbhlate": {"dst", "hbh"}, "dst": {"dst"}, "rt": {"rt"}, "ah": {"ah"},
		"frag": {"frag"}, "hbhfrag": {"hbh", "frag"}, "hbhdst": {"hbh", "dst"},
		"hbhskip": {"hbhskip"}, "hbhdrop": {"hbhdrop"}, "hbhjumbo": {"hbhjumbo"},
		"hbhra": {"hbhra"}, "hbhpad": {"hbhpad"}, "hbhmis": {"hbhmis"}, "hbhrt": {"hbh", "rt"}, "hbhah": {"hbh", "ah"},
		"dstdrop": {"dstdrop"}, "dstjumbo": {"dstjumbo"}, "rtdst": {"rt", "dstdrop"},
		"fragfrag": {"frag", "dst", "frag"},
	}
)

// edgeChainNames6 is edgeChains6's keys in a fixed order.
func edgeChainNames6() []string {
	return []string{"none", "hbh", "hbhlate", "dst", "rt", "ah", "frag", "hbhfrag", "hbhdst", "hbhskip", "hbhdrop", "hbhjumbo",
		"hbhra", "hbhpad", "hbhmis", "hbhrt", "hbhah", "dstdrop", "dstjumbo", "rtdst", "fragfrag"}
}

// edgeFrame is a built frame and where its headers are.
type edgeFrame struct {
	b        []byte
	l3, l4   int
	ihl      int // IPv4: the header's length as built
	trailer  int
	exts     []int  // offsets of the extension headers (IPv4: AH)
	kinds    []byte // their next-header numbers
	src, dst netip.Addr
}

func extHeader(kind string) (byte, []byte) {
	switch kind {
	case "hbh", "dst":
		h := []byte{0, 0, 1, 4, 0, 0, 0, 0} // PadN
		if kind == "dst" {
			return extDst, h
		}
		return extHBH, h
	case "hbhskip":
		return extHBH, []byte{0, 0, 0x1e, 4, 0, 0, 0, 0}
	case "hbhdrop":
		return extHBH, []byte{0, 0, 0x5e, 4, 0, 0, 0, 0}
	case "hbhjumbo":
		return extHBH, []byte{0, 0, 0xc2, 4, 0, 1, 0x11, 0x70} // 70000
	case "hbhra": // Router Alert, an option to skip, PadN
		return extHBH, []byte{0, 1, 5, 2, 0, 0, 0x1e, 4, 1, 2, 3, 4, 1, 2, 0, 0}
	case "hbhpad": // four Pad1 and a PadN of 2
		return extHBH, []byte{0, 0, 0, 0, 0, 0, 1, 0}
	case "hbhmis": // a Jumbo Payload at offset 3: misaligned
		return extHBH, []byte{0, 1, 0, 0xc2, 4, 0, 1, 0x11, 0x70, 1, 5, 0, 0, 0, 0, 0}
	case "dstdrop":
		return extDst, []byte{0, 0, 0x5e, 4, 0, 0, 0, 0}
	case "dstjumbo":
		return extDst, []byte{0, 0, 0xc2, 4, 0, 1, 0x11, 0x70}
	case "rt":
		return extRt, []byte{0, 0, 0, 0, 0, 0, 0, 0} // type 0, no segments left
	case "ah":
		h := make([]byte, 16) // 4 words less 2: length 2
		h[1] = 2
		binary.BigEndian.PutUint32(h[4:], 0x100)
		return extAH, h
	case "frag":
		return extFrag, []byte{0, 0, 0, 0, 0, 0, 0x33, 0x33} // atomic
	}
	panic(kind)
}

// edgeL4 is the UDP datagram or TCP SYN of id, checksum left 0.
func edgeL4(tcp bool, id int) (proto byte, b []byte) {
	if tcp {
		b = make([]byte, 24)
		binary.BigEndian.PutUint16(b[0:], uint16(30000+id%30000))
		binary.BigEndian.PutUint16(b[2:], 601)
		binary.BigEndian.PutUint32(b[4:], 0x40000000+uint32(id))
		b[12], b[13] = 6<<4, 0x02
		binary.BigEndian.PutUint16(b[14:], 65535)
		copy(b[20:], []byte{2, 4, 5, 0xb4})
		return 6, b
	}
	msg := fmt.Sprintf("oracle id=%07d;", id)
	b = make([]byte, 8, 8+32)
	b = append(b, msg+strings.Repeat("x", 32-len(msg))...)
	binary.BigEndian.PutUint16(b[0:], uint16(30000+id%30000))
	binary.BigEndian.PutUint16(b[2:], 514)
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	return 17, b
}

// buildEdge builds s's frame carrying id, before its edits and checksums.
func buildEdge(s edgeSpec, id int, n oracleNet) edgeFrame {
	f := edgeFrame{src: n.send4, dst: n.coll4, trailer: s.trailer}
	if s.v6 {
		f.src, f.dst = n.send6, n.coll6
	}
	b := append(append([]byte{}, n.collMAC...), n.sendMAC...)
	for _, v := range edgeVIDs(s) {
		b = binary.BigEndian.AppendUint16(b, 0x8100)
		b = binary.BigEndian.AppendUint16(b, v)
	}
	proto, l4 := edgeL4(s.tcp, id)
	if s.v6 {
		b = f.ipv6(b, s.chain, proto, id)
	} else {
		b = f.ipv4(b, s.chain, proto, id)
	}
	f.l4 = len(b)
	b = append(b, l4...)
	// The natural lengths, before the trailer.
	if s.v6 {
		binary.BigEndian.PutUint16(b[f.l3+4:], uint16(len(b)-f.l3-40))
	} else {
		binary.BigEndian.PutUint16(b[f.l3+2:], uint16(len(b)-f.l3))
	}
	f.b = append(b, make([]byte, s.trailer)...)
	return f
}

// edgeVIDs is the VLAN tags of s: the last vlan edit's count of VID 0
// (priority) tags, or the last vid edit's VIDs, separated by "/".
func edgeVIDs(s edgeSpec) []uint16 {
	var vids []uint16
	for _, e := range s.edits {
		switch e.field {
		case "vlan":
			k, _ := strconv.Atoi(e.value)
			vids = make([]uint16, k)
		case "vid":
			vids = nil
			for _, v := range strings.Split(e.value, "/") {
				x, _ := strconv.Atoi(v)
				vids = append(vids, uint16(x))
			}
		}
	}
	return vids
}

// ipv4 appends to b the EtherType, the IPv4 header (with 4 bytes of NOP
// options for chain opts) and, for chain ah, an AH naming proto.
func (f *edgeFrame) ipv4(b []byte, chain string, proto byte, id int) []byte {
	b = binary.BigEndian.AppendUint16(b, 0x0800)
	f.l3 = len(b)
	f.ihl = 20
	if chain == "opts" {
		f.ihl = 24
	}
	h := make([]byte, f.ihl)
	h[0] = 0x40 | byte(f.ihl/4)
	binary.BigEndian.PutUint16(h[4:], uint16(id))
	h[8], h[9] = 64, proto
	if chain == "opts" {
		copy(h[20:], []byte{1, 1, 1, 1}) // NOPs
	}
	copy(h[12:], f.src.AsSlice())
	copy(h[16:], f.dst.AsSlice())
	b = append(b, h...)
	if chain == "ah" {
		b[f.l3+9] = extAH
		_, ah := extHeader("ah")
		ah[0] = proto
		f.exts, f.kinds = append(f.exts, len(b)), append(f.kinds, extAH)
		b = append(b, ah...)
	}
	return b
}

// ipv6 appends to b the EtherType, the IPv6 header and the extension
// headers of chain, the last naming proto.
func (f *edgeFrame) ipv6(b []byte, chain string, proto byte, id int) []byte {
	b = binary.BigEndian.AppendUint16(b, 0x86dd)
	f.l3 = len(b)
	h := make([]byte, 40)
	h[0], h[7] = 0x60, 64
	copy(h[8:], f.src.AsSlice())
	copy(h[24:], f.dst.AsSlice())
	b = append(b, h...)
	next := f.l3 + 6 // where the next header's number goes
	for _, k := range edgeChains6[chain] {
		kind, eh := extHeader(k)
		if kind == extFrag {
			binary.BigEndian.PutUint32(eh[4:], uint32(id)) // one reassembly queue per case
		}
		b[next] = kind
		next = len(b)
		f.exts, f.kinds = append(f.exts, len(b)), append(f.kinds, kind)
		b = append(b, eh...)
	}
	b[next] = proto
	return b
}

// tail is the last fragment that completes f when f is a first fragment
// (offset 0, more fragments) whose fragmentable part is a multiple of 8
// bytes: 8 bytes of zeros at the offset after it, so that the kernel can
// reassemble the datagram and judge it whole; nil otherwise.
func (f *edgeFrame) tail(v6 bool) []byte {
	end := len(f.b) - f.trailer
	var head []byte
	var fragLen int
	if !v6 {
		fo := binary.BigEndian.Uint16(f.b[f.l3+6:])
		if fo&0x2000 == 0 || fo&0x1fff != 0 {
			return nil
		}
		fragLen = end - f.l3 - f.ihl
		head = append([]byte{}, f.b[:f.l3+f.ihl]...)
		binary.BigEndian.PutUint16(head[f.l3+6:], uint16(fragLen/8))
		binary.BigEndian.PutUint16(head[f.l3+2:], uint16(f.ihl+8))
		ihl := int(head[f.l3]&0xf) * 4
		if ihl >= 20 && f.l3+ihl <= len(head) {
			binary.BigEndian.PutUint16(head[f.l3+10:], 0)
			binary.BigEndian.PutUint16(head[f.l3+10:], csum16(0, head[f.l3:f.l3+ihl]))
		}
	} else {
		i := strings.IndexByte(string(f.kinds), extFrag)
		if i < 0 {
			return nil
		}
		at := f.exts[i]
		fo := binary.BigEndian.Uint16(f.b[at+2:])
		if fo&1 == 0 || fo&0xfff8 != 0 {
			return nil
		}
		fragLen = end - at - 8
		head = append([]byte{}, f.b[:at+8]...)
		binary.BigEndian.PutUint16(head[at+2:], uint16(fragLen/8)<<3)
		binary.BigEndian.PutUint16(head[f.l3+4:], uint16(at+8+8-f.l3-40))
	}
	if fragLen <= 0 || fragLen%8 != 0 {
		return nil
	}
	return append(head, make([]byte, 8)...)
}

// edgeValue is the number an edge value names for a field whose minimum,
// remainder (what the rest of the frame holds, in the field's units) and
// maximum are given; ok is false for a value the field cannot take.
func edgeValue(v string, minV, rem, maxV int) (int, bool) {
	var x int
	switch v {
	case "zero":
		x = 0
	case "belowmin":
		x = minV - 1
	case "min":
		x = minV
	case "rem-1":
		x = rem - 1
	case "rem":
		x = rem
	case "rem+1":
		x = rem + 1
	case "max":
		x = maxV
	default:
		var err error
		if x, err = strconv.Atoi(v); err != nil {
			return 0, false
		}
	}
	return x, x >= 0 && x <= maxV
}

var edgeValues = []string{"zero", "belowmin", "min", "rem-1", "rem", "rem+1", "max"}

// edgeFragValues are the fragment header's (offset, M) pairs: atomic,
// first, second (8 bytes in), and the largest offset, with M and without.
var edgeFragValues = []string{"0/0", "0/1", "1/0", "1/1", "8191/0", "8191/1"}

// apply makes f's edits; false when an edit does not apply to f.
func (f *edgeFrame) apply(s edgeSpec) bool {
	b := f.b
	for _, e := range s.edits {
		switch e.field {
		case "vlan", "vid": // built in
		case "ip4.tot":
			ihl := int(b[f.l3]&0xf) * 4
			x, ok := edgeValue(e.value, ihl, len(b)-f.l3, 0xffff)
			if !ok {
				return false
			}
			binary.BigEndian.PutUint16(b[f.l3+2:], uint16(x))
		case "ip4.ihl":
			x, ok := edgeValue(e.value, 5, min((len(b)-f.l3)/4, 15), 15)
			if !ok {
				return false
			}
			b[f.l3] = 0x40 | byte(x)
		case "ip6.plen":
			x, ok := edgeValue(e.value, 0, len(b)-f.l3-40, 0xffff)
			if !ok || e.value == "belowmin" {
				return false
			}
			binary.BigEndian.PutUint16(b[f.l3+4:], uint16(x))
		case "ext.len":
			if e.ext >= len(f.exts) {
				return false
			}
			at := f.exts[e.ext]
			minV, rem := 0, (len(b)-at)/8-1
			if f.kinds[e.ext] == extAH {
				minV, rem = 1, (len(b)-at)/4-2
			}
			if f.kinds[e.ext] == extFrag {
				return false // a fixed 8 bytes: its reserved byte is no length
			}
			x, ok := edgeValue(e.value, minV, rem, 255)
			if !ok {
				return false
			}
			b[at+1] = byte(x)
		case "frag":
			var off, more int
			if _, err := fmt.Sscanf(e.value, "%d/%d", &off, &more); err != nil {
				return false
			}
			fo := uint16(off<<3 | more)
			if !s.v6 {
				binary.BigEndian.PutUint16(b[f.l3+6:], uint16(off)|uint16(more)<<13)
				continue
			}
			i := strings.Index(string(f.kinds), string([]byte{extFrag}))
			if i < 0 {
				return false
			}
			binary.BigEndian.PutUint16(b[f.exts[i]+2:], fo)
		case "udp.len":
			if s.tcp {
				return false
			}
			x, ok := edgeValue(e.value, 8, len(b)-f.l4, 0xffff)
			if !ok {
				return false
			}
			binary.BigEndian.PutUint16(b[f.l4+4:], uint16(x))
		case "tcp.doff":
			if !s.tcp {
				return false
			}
			x, ok := edgeValue(e.value, 5, min((len(b)-f.l4)/4, 15), 15)
			if !ok {
				return false
			}
			b[f.l4+12] = byte(x) << 4
		default:
			panic(e.field)
		}
	}
	return true
}

// l4Lengths are the lengths the kernel may checksum the L4 header and
// payload over: the datagram as built, the IP length fields' view, the
// rest of the frame (a payload length of 0, a trailer), and a UDP length.
// Each is a variant of the frame with its own checksum, so that the
// kernel's reading of the lengths, not the generator's, decides which one
// it delivers.
func (f *edgeFrame) l4Lengths(s edgeSpec, natural, extra int) []int {
	b := f.b
	rest := len(b) - f.l4
	c := []int{natural, rest}
	if s.v6 {
		c = append(c, int(binary.BigEndian.Uint16(b[f.l3+4:]))+f.l3+40-f.l4)
	} else {
		c = append(c, int(binary.BigEndian.Uint16(b[f.l3+2:]))+f.l3-f.l4)
	}
	if !s.tcp {
		c = append(c, int(binary.BigEndian.Uint16(b[f.l4+4:])))
	}
	minL := 8
	if s.tcp {
		minL = 20
	}
	if extra > 0 { // a tail fragment adds extra bytes to the datagram
		for _, l := range c {
			c = append(c, l+extra)
		}
	}
	var out []int
	seen := map[int]bool{}
	for _, l := range c {
		if l >= minL && l <= rest+extra && !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		out = []int{min(natural, rest)}
	}
	return out
}

// finish writes the IPv4 header checksum and the L4 checksum over l bytes
// (IPv4 UDP: none, 0).
func (f *edgeFrame) finish(s edgeSpec, l int) {
	b := f.b
	if !s.v6 {
		ihl := int(b[f.l3]&0xf) * 4
		if ihl >= 20 && f.l3+ihl <= len(b) {
			binary.BigEndian.PutUint16(b[f.l3+10:], 0)
			binary.BigEndian.PutUint16(b[f.l3+10:], csum16(0, b[f.l3:f.l3+ihl]))
		}
	}
	proto, at := byte(17), f.l4+6
	if s.tcp {
		proto, at = 6, f.l4+16
	}
	if at+2 > len(b) {
		return
	}
	binary.BigEndian.PutUint16(b[at:], 0)
	if !s.v6 && !s.tcp {
		return
	}
	m := mut{v6: s.v6, src: f.src, dst: f.dst}
	sum := csum16(m.pseudo(proto, l), b[f.l4:f.l4+min(l, len(b)-f.l4)])
	if sum == 0 && !s.tcp {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(b[at:], sum)
}

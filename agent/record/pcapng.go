package record

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// The shed record's pcapng files (DESIGN.md §10) are written with the
// maintained gopacket fork's pcapgo (github.com/gopacket/gopacket): the
// NgWriter of github.com/google/gopacket, which the tests use to build
// frames, has no per-packet options, so it cannot write the packet comment
// that carries each sample's verdict.

// pcapPrefix and pcapSuffix frame the files' names: shed-<UTC time with
// ns>.pcapng, so that names sort by age.
const (
	pcapPrefix = "shed-"
	pcapSuffix = ".pcapng"
	// pcapFiles is how many files max_bytes is split into: a file is
	// closed before it grows past max_bytes / pcapFiles, and the oldest
	// are removed while the directory holds more than max_bytes less one
	// file, the room the next file grows into: the directory never holds
	// more than max_bytes.
	pcapFiles = 8
	// pcapBlockMax bounds what one write adds to a file: an interface
	// block and a packet block of RecordSnapMax bytes with its comment
	// (under 600 bytes together). A file is closed once it is within
	// this of its size.
	pcapBlockMax = 1024
)

// pcapDir writes samples into rotating pcapng files under dir, within
// maxBytes. Every packet is flushed to the file as it is written, so a
// killed agent leaves whole blocks behind: at worst the block being
// written is torn, and readers stop there having read the rest.
type pcapDir struct {
	dir      string
	maxBytes uint64
	snaplen  uint32
	// ifname names an interface by ifindex, for the files' interface blocks.
	ifname func(int) string

	f      *os.File
	cw     *countWriter
	w      *pcapgo.NgWriter
	ifaces map[int]int // ifindex -> the current file's interface id
}

type countWriter struct {
	w io.Writer
	n uint64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += uint64(n)
	return n, err
}

// newPcapDir makes dir (0750) and removes the oldest files beyond maxBytes.
// The pcapDir works even when that fails: each file it opens makes dir
// again, so a dir that cannot be written yet only costs the samples
// written meanwhile.
func newPcapDir(dir string, maxBytes uint64, snaplen uint32, ifname func(int) string) (*pcapDir, error) {
	d := &pcapDir{dir: dir, maxBytes: maxBytes, snaplen: snaplen, ifname: ifname}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return d, fmt.Errorf("record dir: %w", err)
	}
	return d, d.prune()
}

// write appends one packet with its comment, opening a file first when
// none is open, and rotating after it when the file is full. On an error
// the file is closed, and the next write opens a new one.
func (d *pcapDir) write(ts time.Time, ifindex, length int, data []byte, comment string) error {
	if d.w == nil {
		if err := d.open(ts, ifindex); err != nil {
			return err
		}
	}
	id, ok := d.ifaces[ifindex]
	if !ok {
		var err error
		if id, err = d.w.AddInterface(d.iface(ifindex)); err != nil {
			d.close()
			return fmt.Errorf("pcapng interface: %w", err)
		}
		d.ifaces[ifindex] = id
	}
	// A sample taken before a reload lowered the snaplen is cut to the
	// file's: no packet is longer than its interface block says.
	data = data[:min(len(data), int(d.snaplen))]
	ci := gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(data), Length: length, InterfaceIndex: id}
	err := d.w.WritePacketWithOptions(ci, data, pcapgo.NgPacketOptions{Comments: []string{comment}})
	if err == nil {
		err = d.w.Flush()
	}
	if err != nil {
		d.close()
		return fmt.Errorf("write pcapng: %w", err)
	}
	if d.cw.n+pcapBlockMax >= d.fileBytes() {
		d.close()
		return d.prune()
	}
	return nil
}

// setLimits takes a reload's max_bytes and snaplen: a change of either
// closes the file being written (the next sample opens one whose
// interface blocks carry the new snaplen) and removes the oldest files
// beyond the new max_bytes.
func (d *pcapDir) setLimits(maxBytes uint64, snaplen uint32) error {
	if maxBytes == d.maxBytes && snaplen == d.snaplen {
		return nil
	}
	d.maxBytes, d.snaplen = maxBytes, snaplen
	d.close()
	return d.prune()
}

func (d *pcapDir) iface(ifindex int) pcapgo.NgInterface {
	name := d.ifname(ifindex)
	if name == "" {
		name = fmt.Sprintf("if%d", ifindex)
	}
	return pcapgo.NgInterface{Name: name, LinkType: layers.LinkTypeEthernet, SnapLength: d.snaplen,
		Comment: "shed packets sampled by tierlimit", TimestampResolution: 9}
}

func (d *pcapDir) open(ts time.Time, ifindex int) error {
	if err := os.MkdirAll(d.dir, 0o750); err != nil {
		return fmt.Errorf("record dir: %w", err)
	}
	name := filepath.Join(d.dir, pcapPrefix+ts.UTC().Format("20060102T150405.000000000Z")+pcapSuffix)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return fmt.Errorf("open pcapng file: %w", err)
	}
	cw := &countWriter{w: f}
	w, err := pcapgo.NewNgWriterInterface(cw, d.iface(ifindex), pcapgo.NgWriterOptions{
		SectionInfo: pcapgo.NgSectionInfo{Application: "tierlimit", Comment: "DESIGN.md §10 shed record"}})
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		f.Close()
		os.Remove(name)
		return fmt.Errorf("write pcapng header: %w", err)
	}
	d.f, d.cw, d.w, d.ifaces = f, cw, w, map[int]int{ifindex: 0}
	return nil
}

func (d *pcapDir) close() {
	if d.f != nil {
		d.f.Close()
	}
	d.f, d.cw, d.w, d.ifaces = nil, nil, nil, nil
}

// files lists the record's files in dir, oldest first, with their sizes.
func (d *pcapDir) files() ([]string, []uint64, error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("record dir: %w", err)
	}
	var names []string
	for _, e := range ents {
		if n := e.Name(); e.Type().IsRegular() && strings.HasPrefix(n, pcapPrefix) && strings.HasSuffix(n, pcapSuffix) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	sizes := make([]uint64, len(names))
	for i, n := range names {
		if fi, err := os.Stat(filepath.Join(d.dir, n)); err == nil {
			sizes[i] = uint64(fi.Size())
		}
	}
	return names, sizes, nil
}

// fileBytes is the most a file takes.
func (d *pcapDir) fileBytes() uint64 { return d.maxBytes / pcapFiles }

// prune removes the oldest files, never the open one, while the record's
// files take more than maxBytes less one file (fileBytes): what the next
// file grows into.
func (d *pcapDir) prune() error {
	names, sizes, err := d.files()
	if err != nil {
		return err
	}
	var total uint64
	for _, s := range sizes {
		total += s
	}
	var errs []error
	for i := 0; i < len(names) && total > d.maxBytes-d.fileBytes(); i++ {
		path := filepath.Join(d.dir, names[i])
		if d.f != nil && d.f.Name() == path {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		total -= sizes[i]
	}
	return errors.Join(errs...)
}

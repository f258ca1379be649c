package record

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
)

// TestPcapDirSetLimits: a reload's smaller snaplen and max_bytes close the
// file being written, remove the oldest files beyond the new max_bytes,
// and cut a sample taken before the reload to the new snaplen.
func TestPcapDirSetLimits(t *testing.T) {
	dir := t.TempDir()
	const maxBytes = 256 << 10
	d, err := newPcapDir(dir, maxBytes, 256, func(int) string { return "veth0" })
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1500 { // about 225 kB: several files
		s := testSample(i)
		if err := d.write(time.Now(), 1, s.Len, s.Data, SampleComment(s)); err != nil {
			t.Fatal(err)
		}
	}
	before, _, _ := d.files()
	open := d.f.Name()
	if err := d.setLimits(maxBytes/4, 64); err != nil {
		t.Fatal(err)
	}
	s := testSample(7) // 100 bytes, sampled at the old snaplen
	if err := d.write(time.Now(), 1, s.Len, s.Data, SampleComment(s)); err != nil {
		t.Fatal(err)
	}
	names, sizes, _ := d.files()
	var total uint64
	for _, n := range sizes {
		total += n
	}
	if d.f.Name() == open || total > maxBytes/4 || len(names) >= len(before) {
		t.Errorf("after setLimits: %d files (%d before) of %d bytes, writing %s (was %s); want a new file, within %d",
			len(names), len(before), total, d.f.Name(), open, maxBytes/4)
	}
	d.close()
	newest := filepath.Join(dir, names[len(names)-1])
	f, err := os.Open(newest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	data, ci, err := r.ReadPacketData()
	ifc, _ := r.Interface(0)
	if err != nil || len(data) != 64 || ci.Length != s.Len || ifc.SnapLength != 64 {
		t.Errorf("the new file's packet: %d bytes of %d (%v), snaplen %d; want 64 of %d, snaplen 64", len(data), ci.Length, err, ifc.SnapLength, s.Len)
	}
	checkExternalReaders(t, newest)
}

// TestEventSenderStop: a stopped sender sends what it had queued, then
// ends; its counts are those it shares.
func TestEventSenderStop(t *testing.T) {
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var counts eventCounts
	e := newEventSender(slog.New(slog.DiscardHandler), "udp", ln.LocalAddr().String(), &counts)
	for range 5 {
		e.send([]byte("<37>1 - - tierlimit - x - queued"))
	}
	e.stop()
	done := make(chan struct{})
	go func() { e.run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a stopped sender did not end")
	}
	buf := make([]byte, 512)
	got := 0
	for {
		ln.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, _, err := ln.ReadFrom(buf); err != nil {
			break
		}
		got++
	}
	if got != 5 || counts.sent.Load() != 5 || counts.errs.Load() != 0 {
		t.Errorf("received %d, counted sent %d errors %d; want the 5 queued before stop", got, counts.sent.Load(), counts.errs.Load())
	}
}

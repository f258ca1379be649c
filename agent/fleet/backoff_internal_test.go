package fleet

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestBackoffRotation: a credentials file rotated while a refused attempt
// is on its way (the attempt dialled with the old password, the refusal
// came back after the swap) is tried again at the next report, not after
// the backoff. The fingerprint recorded is the one from before the attempt
// (wait's); recorded after the refusal, it matched the rotated files and
// the member stayed refused up to maxBackoff (TestFleetRotation on a busy
// CI machine: 9 reports of 100 ms where 2 are the bound).
func TestBackoffRotation(t *testing.T) {
	const report = 100 * time.Millisecond
	content := "pw-old"
	files := func() []byte { return []byte(content) }
	refused := refusal(errors.New("WRONGPASS invalid username-password pair or user is disabled."))
	if !isAuth(refused) {
		t.Fatalf("%v: not read as a refusal", refused)
	}

	var b backoff
	t0 := time.Unix(1_000_000, 0)
	before, err := b.wait(t0, files)
	if err != nil || before != nil {
		t.Fatalf("first attempt: wait = %q, %v; want nil, nil (no failure yet)", before, err)
	}
	b.done(t0, report, refused, before, files)

	// Refused until the backoff ends; the files unchanged.
	if _, err := b.wait(t0.Add(time.Millisecond), files); err == nil {
		t.Fatal("a refused member tried again at once with the same files")
	}
	// Past maxBackoff an attempt goes out; the file is swapped while it is
	// on its way, and the store refuses the old password it carried.
	now := t0.Add(2 * maxBackoff)
	before, err = b.wait(now, files)
	if err != nil || string(before) != "pw-old" {
		t.Fatalf("after the backoff: wait = %q, %v; want the files as they are, nil", before, err)
	}
	content = "pw-new"
	b.done(now.Add(5*time.Millisecond), report, refused, before, files)

	// The next report tries the new password at once.
	if before, err := b.wait(now.Add(report), files); err != nil || string(before) != "pw-new" {
		t.Fatalf("a rotation during the refused attempt: wait = %q, %v; want an attempt now with the new files", before, err)
	}

	// And a refusal of the new files backs off again until they change.
	b.done(now.Add(report), report, refused, []byte("pw-new"), files)
	if _, err := b.wait(now.Add(report+time.Millisecond), files); err == nil {
		t.Fatal("the new password refused: tried again at once with the same files")
	}

	// A success ends the run of failures: no file is read before the next attempt.
	b.done(now.Add(3*maxBackoff), report, nil, nil, files)
	reads := 0
	count := func() []byte { reads++; return files() }
	if before, err := b.wait(now.Add(3*maxBackoff), count); err != nil || before != nil || reads != 0 {
		t.Fatalf("after a success: wait = %q, %v, %d reads; want nil, nil, 0", before, err, reads)
	}

	// A store out of reach (no refusal): backing off reads no file; the
	// attempt after the backoff reads them once.
	t1 := now.Add(4 * maxBackoff)
	b.done(t1, report, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, nil, count)
	if _, err := b.wait(t1.Add(time.Millisecond), count); err == nil || reads != 0 {
		t.Fatalf("backing off from a reset: wait = %v, %d reads; want a backingOffError, 0", err, reads)
	}
	if before, err := b.wait(t1.Add(2*maxBackoff), count); err != nil || string(before) != "pw-new" || reads != 1 {
		t.Fatalf("after the backoff from a reset: wait = %q, %v, %d reads; want the files, nil, 1", before, err, reads)
	}
}

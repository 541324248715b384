package crashtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rss returns the resident set size of process pid, in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// treeSize is the sum of the sizes of the files under dir.
func treeSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// TestSessionChurnProcess measures the real `mcprelay serve` (disk store,
// built-in example server) while sessions are created, used by a short
// call and deleted, 2500 at a time: its RSS and its data dir. It logs the
// figures; it fails only if the data dir keeps what deleted sessions held
// (the store-level bounds are in eventlog/pebblestore TestSessionChurn).
func TestSessionChurnProcess(t *testing.T) {
	needBinary(t)
	if os.Getenv("MCPRELAY_CHURN") == "" {
		t.Skip("a measurement (minutes): set MCPRELAY_CHURN=1 (and MCPRELAY_CHURN_ARGS for more serve flags)")
	}
	const perRound = 2500
	rounds := 4
	if n, err := strconv.Atoi(os.Getenv("MCPRELAY_CHURN_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	p := newRelay(t)
	if extra := os.Getenv("MCPRELAY_CHURN_ARGS"); extra != "" { // e.g. "--sync none" or "--store memory"
		p.kill()
		p.args = append(p.args, strings.Fields(extra)...)
		p.start()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rounds)*2*time.Minute)
	defer cancel()
	for r := range rounds {
		for i := range perRound {
			sid, err := initialize(ctx, p.url())
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("r%d-%d", r, i)
			resp, err := do(ctx, p.url(), http.MethodPost, sessionHeaders(sid, ""), callBody(name, name, 3, 0))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("call: %v %v", resp, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			resp, err = do(ctx, p.url(), http.MethodDelete, sessionHeaders(sid, ""), "")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				t.Fatalf("DELETE: %s", resp.Status)
			}
		}
		t.Logf("after %5d sessions created and deleted: RSS %6.1f MB, data dir %6.1f MB",
			(r+1)*perRound, float64(rss(t, p.cmd.Process.Pid))/1e6, float64(treeSize(p.dataDir))/1e6)
	}
	time.Sleep(3 * time.Second) // the store's background compaction
	size := treeSize(p.dataDir)
	t.Logf("3s later: RSS %.1f MB, data dir %.1f MB", float64(rss(t, p.cmd.Process.Pid))/1e6, float64(size)/1e6)
	p.kill()
	start := time.Now()
	p.start()
	t.Logf("restart: listening after %v, RSS %.1f MB", time.Since(start), float64(rss(t, p.cmd.Process.Pid))/1e6)
	if size > 64<<20 && !strings.Contains(os.Getenv("MCPRELAY_CHURN_ARGS"), "memory") {
		t.Errorf("data dir %d bytes with no live session", size)
	}
}

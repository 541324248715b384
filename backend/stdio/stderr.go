package stdio

import (
	"bufio"
	"errors"
	"io"
	"time"
)

// Limits on what of a child's stderr reaches the log.
const (
	maxStderrLine = 4 << 10 // bytes kept of one line
	stderrRate    = 50      // lines per second, in bursts of as many
)

// readStderr logs the child's stderr line by line (each cut to
// maxStderrLine bytes, at most stderrRate lines a second, the number of
// lines dropped logged when logging resumes) and keeps the last line.
func (s *Session) readStderr() {
	defer close(s.stderrDone)
	s.logStderr(s.stderr)
}

func (s *Session) logStderr(r io.Reader) {
	br := bufio.NewReaderSize(r, maxStderrLine)
	tokens, last := float64(stderrRate), time.Now()
	dropped := 0
	for {
		line, err := br.ReadSlice('\n')
		cut := errors.Is(err, bufio.ErrBufferFull)
		if len(line) > 0 {
			text := string(trimEOL(line))
			if cut {
				text += "…"
				for errors.Is(err, bufio.ErrBufferFull) { // skip the rest of the line
					_, err = br.ReadSlice('\n')
				}
			}
			s.mu.Lock()
			s.lastStderr = text
			s.mu.Unlock()
			now := time.Now()
			tokens = min(stderrRate, tokens+now.Sub(last).Seconds()*stderrRate)
			last = now
			if tokens >= 1 {
				tokens--
				if dropped > 0 {
					s.log.Warn("stdio: child's stderr lines dropped (rate limit)", "dropped", dropped)
					dropped = 0
				}
				s.log.Info("stdio: child's stderr", "line", text)
			} else {
				dropped++
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			break
		}
	}
	if dropped > 0 {
		s.log.Warn("stdio: child's stderr lines dropped (rate limit)", "dropped", dropped)
	}
}

func trimEOL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

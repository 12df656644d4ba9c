package reference

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgepipe/edgepipe/internal/cli"
)

// runTimeout bounds one run of a program: a start-up with every sink, or a
// run until the first poll of every dataset.
const runTimeout = 3 * time.Minute

// helpJSON runs `bin --help-json` and returns the command line it prints.
func helpJSON(ctx context.Context, bin string) (*cli.CommandLine, error) {
	out, err := output(ctx, bin, []string{"--help-json"}, nil)
	if err != nil {
		return nil, err
	}
	var cl cli.CommandLine
	if err := json.Unmarshal(out, &cl); err != nil {
		return nil, fmt.Errorf("%s --help-json: %w", filepath.Base(bin), err)
	}
	return &cl, nil
}

// describeMetrics starts bin with args and the hidden
// --web.describe-metrics, which makes it start up and write its registry's
// metric families instead of serving, and returns them.
func describeMetrics(ctx context.Context, bin, workDir string, env []string, args ...string) ([]cli.MetricFamily, error) {
	file := filepath.Join(workDir, filepath.Base(bin)+"-metrics.json")
	args = append(args, "--web.listen-address=127.0.0.1:0", "--web.describe-metrics="+file)
	if _, err := output(ctx, bin, args, env); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var mfs []cli.MetricFamily
	if err := json.Unmarshal(b, &mfs); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return mfs, nil
}

// output runs bin with args, and env added to this process's environment,
// and returns its standard output; an error carries the end of its standard
// error.
func output(ctx context.Context, bin string, argv, env []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(argv, " "), err, tail(stderr.String(), 3000))
	}
	return stdout.Bytes(), nil
}

// listeningOn is exporter-toolkit's log line naming the address it serves.
var listeningOn = regexp.MustCompile(`msg="Listening on" address=(\S+)`)

// awaitFamilies bounds how long scrapeWhenReady waits, after /readyz, for
// the families it is told to await: those appear within seconds of the
// first poll, or only with an event a healthy run never has.
const awaitFamilies = time.Minute

// scrapeWhenReady starts bin with args on a free loopback port, waits until
// its /readyz answers 200, scrapes /metrics until it has every family of
// await (at most awaitFamilies) and stops it.
func scrapeWhenReady(ctx context.Context, bin string, env, await []string, args ...string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, "--web.listen-address=127.0.0.1:0")...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	log := &logTail{}
	addr := make(chan string, 1)
	var copying sync.WaitGroup
	copying.Go(func() { log.follow(stderr, addr) })
	mfs, err := func() (map[string]*dto.MetricFamily, error) {
		select {
		case a := <-addr:
			base := "http://" + a
			if err := waitReady(ctx, base+"/readyz"); err != nil {
				return nil, err
			}
			return scrapeAwaiting(ctx, base+"/metrics", await)
		case <-ctx.Done():
			return nil, fmt.Errorf("not listening: %w", ctx.Err())
		}
	}()
	cancel() // SIGTERM
	copying.Wait()
	if werr := cmd.Wait(); err == nil && werr != nil && !errors.Is(ctx.Err(), context.Canceled) {
		err = werr
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, tail(log.String(), 3000))
	}
	return mfs, nil
}

// logTail keeps a program's log, and sends the address it listens on once.
type logTail struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logTail) follow(r io.Reader, addr chan<- string) {
	sc := bufio.NewScanner(r)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		l.buf.WriteString(line + "\n")
		l.mu.Unlock()
		if m := listeningOn.FindStringSubmatch(line); m != nil && !sent {
			addr <- m[1]
			sent = true
		}
	}
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitReady polls url until it answers 200.
func waitReady(ctx context.Context, url string) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never answered 200: %w", url, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scrapeAwaiting scrapes url until the exposition has every family of
// await, or awaitFamilies passed, and returns the last scrape.
func scrapeAwaiting(ctx context.Context, url string, await []string) (map[string]*dto.MetricFamily, error) {
	deadline := time.Now().Add(awaitFamilies)
	for {
		mfs, err := scrape(ctx, url)
		if err != nil {
			return nil, err
		}
		missing := slices.ContainsFunc(await, func(name string) bool { return mfs[name] == nil })
		if !missing || time.Now().After(deadline) {
			return mfs, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// scrape reads the text exposition at url.
func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return mfs, nil
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

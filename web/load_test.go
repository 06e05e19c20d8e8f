package web

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/rego"
)

// TestLoad: 20,000 mixed requests from 50 concurrent clients on
// loopback, with event-stream clients of both forms connecting and
// vanishing all along:
// no 5xx, no panic, and the goroutine count back to where it was.
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test: run without -short")
	}
	f := newFixture(t, 200, Limits{SnapshotInterval: 20 * time.Millisecond, MutationsPerSecond: 10, MutationBurst: 10, MaxStreams: 16})
	f.s.SetReady(true)
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	base := runtime.NumGoroutine()

	const total, workers = 20000, 50
	good := string(policyBody(t, readFS(t, rego.Default())))
	reqs := []func() *http.Request{
		func() *http.Request { return get(ts.URL + "/api/v1/status") },
		func() *http.Request { return get(ts.URL + "/api/v1/processes") },
		func() *http.Request { return get(ts.URL + "/api/v1/processes?class=best-effort&state=running") },
		func() *http.Request { return get(ts.URL + "/api/v1/processes/1010") },
		func() *http.Request { return get(ts.URL + "/api/v1/processes/7") },
		func() *http.Request { return get(ts.URL + "/api/v1/classes") },
		func() *http.Request { return get(ts.URL + "/api/v1/gpus") },
		func() *http.Request { return get(ts.URL + "/api/v1/decisions?since=1000&limit=50") },
		func() *http.Request { return get(ts.URL + "/api/v1/preemptions?limit=10") },
		func() *http.Request { return get(ts.URL + "/api/v1/policy") },
		func() *http.Request { return get(ts.URL + "/metrics") },
		func() *http.Request { return get(ts.URL + "/readyz") },
		func() *http.Request { return get(ts.URL + "/api/v1/nope?x=%zz") },
		func() *http.Request { return post(ts.URL+"/api/v1/policy/validate", f.token, `{"files": {`) },
		func() *http.Request { return post(ts.URL+"/api/v1/policy/rollback", "wrong", `{"revision":"x"}`) },
		func() *http.Request { return post(ts.URL+"/api/v1/policy/dry-run", f.token, good) },
	}
	var (
		next   atomic.Int64
		codes  sync.Map
		errs   atomic.Int64
		wg     sync.WaitGroup
		stop   = make(chan struct{})
		panics atomic.Int64
	)
	// The engine keeps changing: launches and requests.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			f.eng.src.push(launchEv(uint32(1000 + i%200)))
			if i%10 == 0 {
				f.eng.requests(200, 1)
			}
		}
	}()
	// Stream clients of both forms connect, read a little, and vanish.
	var streams atomic.Int64
	for w := range 4 {
		form := []string{"", "?form=delta"}[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/v1/events"+form, nil)
				resp, err := client.Do(req)
				if err == nil {
					if resp.StatusCode == 200 {
						streams.Add(1)
						br := bufio.NewReader(resp.Body)
						for range 2 + i%5 {
							if _, err := br.ReadString('\n'); err != nil {
								break
							}
						}
					} else if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
						errs.Add(1)
					}
					if i%2 == 0 {
						resp.Body.Close()
					}
				}
				cancel()
			}
		}()
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > total {
					return
				}
				resp, err := client.Do(reqs[int(n)%len(reqs)]())
				if err != nil {
					t.Errorf("request %d: %v", n, err)
					errs.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				c, _ := codes.LoadOrStore(resp.StatusCode, new(atomic.Int64))
				c.(*atomic.Int64).Add(1)
			}
		}()
	}
	for next.Load() <= total {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	var summary []string
	var sum int64
	codes.Range(func(k, v any) bool {
		n := v.(*atomic.Int64).Load()
		sum += n
		summary = append(summary, fmt.Sprintf("%d×%d", n, k))
		if k.(int) >= 500 {
			t.Errorf("%d responses with status %d", n, k)
		}
		return true
	})
	t.Logf("%d requests: %s; %d streams opened", sum, strings.Join(summary, " "), streams.Load())
	if sum != total || errs.Load() != 0 || panics.Load() != 0 {
		t.Errorf("%d of %d answered, %d errors", sum, total, errs.Load())
	}
	if streams.Load() < 10 {
		t.Errorf("only %d streams opened", streams.Load())
	}
	tr.CloseIdleConnections()
	ts.CloseClientConnections()
	waitClients(t, f, 0)
	if n := f.s.hub.deltas.Load(); n != 0 {
		t.Errorf("%d delta clients counted with none connected", n)
	}
	waitGoroutines(t, base+2)
}

func get(url string) *http.Request {
	req, _ := http.NewRequest("GET", url, nil)
	return req
}

func post(url, token, body string) *http.Request {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	return req
}

package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// answer is what one request to the bundle server gave.
type answer struct {
	// notModified: 304, the bundle of the ETag sent is still current.
	notModified bool
	body        []byte
	etag        string
}

// problem is a fetch that gave no bundle, or a bundle refused, and why.
type problem struct {
	reason Reason
	err    error
}

func (p *problem) Error() string { return p.err.Error() }
func (p *problem) Unwrap() error { return p.err }

// client makes the requests of one Poller.
type client struct {
	url       string
	http      *http.Client
	tokenFile string
	timeout   time.Duration
	maxBytes  int64
	userAgent string
}

// get asks for the bundle, conditionally on etag when it is set. Errors
// are *problem.
func (c *client) get(ctx context.Context, etag string) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return answer{}, &problem{ReasonConnection, err}
	}
	req.Header.Set("Accept", "application/gzip, application/vnd.openpolicyagent.bundles")
	req.Header.Set("User-Agent", c.userAgent)
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	if c.tokenFile != "" {
		tok, err := readToken(c.tokenFile)
		if err != nil {
			return answer{}, &problem{ReasonToken, err}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{}, c.transportProblem(ctx, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && etag != "":
		return answer{notModified: true, etag: etag}, nil
	case resp.StatusCode != http.StatusOK:
		return answer{}, &problem{ReasonHTTPStatus, fmt.Errorf("the server answered %s%s", resp.Status, excerpt(resp.Body))}
	case resp.ContentLength > c.maxBytes:
		return answer{}, &problem{ReasonTooLarge, fmt.Errorf("the bundle is %d bytes, over the limit of %d (--bundle-max-bytes)", resp.ContentLength, c.maxBytes)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBytes+1))
	if err != nil {
		return answer{}, c.transportProblem(ctx, fmt.Errorf("reading the bundle: %w", err))
	}
	if int64(len(body)) > c.maxBytes {
		return answer{}, &problem{ReasonTooLarge, fmt.Errorf("the bundle is over the limit of %d bytes (--bundle-max-bytes); stopped reading it there", c.maxBytes)}
	}
	return answer{body: body, etag: resp.Header.Get("ETag")}, nil
}

// transportProblem names a request that got no answer: a timeout, or a
// server that could not be reached.
func (c *client) transportProblem(ctx context.Context, err error) *problem {
	var ne net.Error
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return &problem{ReasonTimeout, fmt.Errorf("no answer within %v (--bundle-timeout): %w", c.timeout, err)}
	}
	return &problem{ReasonConnection, err}
}

// readToken reads the bearer token at every request, so that a rotated
// token is used at once.
func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("bundle server token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case tok == "":
		return "", fmt.Errorf("bundle server token file %s is empty", file)
	case strings.ContainsAny(tok, "\r\n"):
		return "", fmt.Errorf("bundle server token file %s holds more than one line; it must hold the token alone", file)
	}
	return tok, nil
}

// excerpt is the start of an error answer's body, quoted, for the message.
func excerpt(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 200))
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	return ": " + strconv.Quote(s)
}

package config

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
)

// HTTPSource reads the rules document at an http:// or https:// URL, with
// conditional requests: once the server has given an ETag or a
// Last-Modified time, each Load sends If-None-Match or If-Modified-Since,
// and a 304 Not Modified answer costs no transfer and no parse. Any status
// but 200 and 304 is an error, as is a body larger than MaxFileSize.
//
// An HTTPSource is safe for concurrent use.
type HTTPSource struct {
	// URL is the document's address. Required.
	URL string

	// Client sends the requests; nil means http.DefaultClient. The
	// Reloader bounds each request with SourceOptions.Timeout.
	Client *http.Client

	// Header is sent with every request, for example an Authorization
	// token for the rules service.
	Header http.Header

	mu           sync.Mutex
	etag, modded string // validators of the last document returned
}

// Name returns the URL, without its password if it has one.
func (s *HTTPSource) Name() string {
	u, err := url.Parse(s.URL)
	if err != nil {
		return s.URL
	}
	return u.Redacted()
}

// Load fetches the document. Its version is the ETag, or else the
// Last-Modified time, that the server sent with it.
func (s *HTTPSource) Load(ctx context.Context) ([]byte, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return nil, "", err
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return nil, "", fmt.Errorf("unsupported URL scheme %q: want http or https", req.URL.Scheme)
	}
	for k, v := range s.Header {
		req.Header[k] = v
	}
	s.mu.Lock()
	etag, modded := s.etag, s.modded
	s.mu.Unlock()
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	if modded != "" {
		req.Header.Set("If-Modified-Since", modded)
	}
	req.Header.Set("Accept", "application/yaml, application/json;q=0.9, */*;q=0.5")
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotModified:
		if etag != "" || modded != "" {
			return nil, "", ErrNotModified
		}
		fallthrough
	default:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, "", fmt.Errorf("GET: unexpected status %s", resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxFileSize+1))
	if err != nil {
		return nil, "", fmt.Errorf("reading the body: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, "", &Error{File: s.Name(), Msg: fmt.Sprintf("document larger than %d bytes", MaxFileSize)}
	}
	etag, modded = resp.Header.Get("ETag"), resp.Header.Get("Last-Modified")
	s.mu.Lock()
	s.etag, s.modded = etag, modded
	s.mu.Unlock()
	version := etag
	if version == "" {
		version = modded
	}
	return data, version, nil
}

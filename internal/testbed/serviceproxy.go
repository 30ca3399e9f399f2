package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ServiceProxy forwards the TCP connections made to an address of the
// node's bridge to a ready endpoint of Service namespace/name's port,
// resolved from its EndpointSlices for every connection, as kube-proxy's
// userspace mode does. It is the path from a VM's guest, behind its
// launcher pod's masquerade, to a Service: no kube-proxy runs on the test
// bed's node (it would rewrite the machine's firewall) and no cluster DNS,
// so a BSLS's clientURL names this address, as an admin names an address
// guests reach when they cannot resolve the Service's name. It listens on
// the bridge's gateway address, which pods and this machine both reach,
// and stops, closing its connections, with the test.
func (n *Node) ServiceProxy(tb TB, namespace, name string, port int32) (string, error) {
	return n.ServiceProxies(tb, namespace, name, port)
}

// ServiceProxies is ServiceProxy for several ports of the Service at once,
// on consecutive ports of the bridge's address, in the order given; it
// returns the first's address. A BSLS's client port is its server port
// plus one (clientdist.Port), and guests find it so from its clientURL.
func (n *Node) ServiceProxies(tb TB, namespace, name string, ports ...int32) (string, error) {
	var listeners []net.Listener
	closeAll := func() {
		for _, l := range listeners {
			_ = l.Close()
		}
		listeners = nil
	}
	// Another process may hold a port after the first: a bounded number
	// of tries from fresh first ports.
	for try := 0; len(listeners) < len(ports) && try < 20; try++ {
		closeAll()
		first, err := net.Listen("tcp", net.JoinHostPort(n.Gateway.String(), "0"))
		if err != nil {
			return "", fmt.Errorf("proxy for Service %s/%s: %w", namespace, name, err)
		}
		listeners = append(listeners, first)
		base := first.Addr().(*net.TCPAddr).Port
		for i := 1; i < len(ports); i++ {
			l, err := net.Listen("tcp", net.JoinHostPort(n.Gateway.String(), strconv.Itoa(base+i)))
			if err != nil {
				break
			}
			listeners = append(listeners, l)
		}
	}
	if len(listeners) < len(ports) {
		closeAll()
		return "", fmt.Errorf("proxy for Service %s/%s: no %d consecutive free ports on %s", namespace, name, len(ports), n.Gateway)
	}
	var wg sync.WaitGroup
	var proxies []*serviceProxy
	for i, l := range listeners {
		p := &serviceProxy{c: n.API.Client, namespace: namespace, name: name, port: ports[i], conns: map[net.Conn]bool{}}
		proxies = append(proxies, p)
		wg.Go(func() { p.serve(l) })
	}
	tb.Cleanup(func() {
		for i, l := range listeners {
			_ = l.Close()
			proxies[i].closeAll()
		}
		wg.Wait()
	})
	return listeners[0].Addr().String(), nil
}

type serviceProxy struct {
	c               client.Client
	namespace, name string
	port            int32
	mu              sync.Mutex
	closed          bool
	conns           map[net.Conn]bool
	wg              sync.WaitGroup
}

func (p *serviceProxy) serve(l net.Listener) {
	defer p.wg.Wait()
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.forward(in) })
	}
}

// track remembers conns until closeAll; false once closed.
func (p *serviceProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range conns {
		p.conns[c] = true
	}
	return true
}

// untrack forgets conns, which their forward is done with.
func (p *serviceProxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		delete(p.conns, c)
	}
}

func (p *serviceProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *serviceProxy) forward(in net.Conn) {
	defer in.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	addr, err := p.endpoint(ctx)
	cancel()
	if err != nil {
		return
	}
	out, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return
	}
	defer out.Close()
	if !p.track(in, out) {
		return
	}
	defer p.untrack(in, out)
	var copies sync.WaitGroup
	copies.Go(func() { copyHalf(out, in) })
	copyHalf(in, out)
	copies.Wait()
}

// copyHalf copies one direction and then closes the other side's writing.
func copyHalf(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if tcp, ok := dst.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
	} else {
		_ = dst.Close()
	}
}

// endpoint is a ready endpoint's address for the Service's port.
func (p *serviceProxy) endpoint(ctx context.Context) (string, error) {
	svc := &corev1.Service{}
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: p.namespace, Name: p.name}, svc); err != nil {
		return "", err
	}
	portName := ""
	found := false
	for _, sp := range svc.Spec.Ports {
		if sp.Port == p.port {
			portName, found = sp.Name, true
		}
	}
	if !found {
		return "", fmt.Errorf("service %s/%s has no port %d", p.namespace, p.name, p.port)
	}
	var slices discoveryv1.EndpointSliceList
	if err := p.c.List(ctx, &slices, client.InNamespace(p.namespace), client.MatchingLabels{discoveryv1.LabelServiceName: p.name}); err != nil {
		return "", err
	}
	for _, s := range slices.Items {
		var target int32
		for _, ep := range s.Ports {
			if ep.Port != nil && (ep.Name == nil && portName == "" || ep.Name != nil && *ep.Name == portName) {
				target = *ep.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready || len(e.Addresses) == 0 {
				continue
			}
			return net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(target))), nil
		}
	}
	return "", errors.New("no ready endpoint")
}

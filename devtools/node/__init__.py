"""The real node, a real Kubernetes node beside kwok's simulated ones: containerd, runc, the CNI bridge, kubelet and
kube-proxy on this machine, joined to the local control plane, and removed again without a trace.

Everything the node writes lives under one scratch directory, except what the components hard-code (recorded
before the start and removed only when it did not exist then). Pods get addresses on a private /24 on the bridge
`skiffcni0`; the node's own address is on the port-less bridge `skiffnode0`; the kubelet and kube-proxy serve on
127.0.0.1 only. Safety rules (iptables mangle POSTROUTING, comment `skiff-real-node`) drop any packet for the pod
or Service ranges that would leave through another interface, and pods are not forwarded off the bridge: nothing
for those addresses leaves the machine, by mistake or otherwise. containerd's image pulls go to a dead proxy on
127.0.0.1, and the node carries the taint `skiff.dev/real-node:NoSchedule`, so only pods that ask for it land here,
with images imported from local archives (the pause image is built here, FROM scratch, from build.sh's pause).
containerd and the kubelet share a private mount namespace in which the kernel tunables the kubelet sets are
bind-mounted files, so the host's sysctls stay as they were. One real node runs on a machine at a time (a lock
under /run): a second session waits for the first.

config: its files and network (pure); host: this machine's tools, commands and lock; kept_images and
scratch_image: containerd's image store and the pause image (pure); network_policies: the NetworkPolicy engine's
binary, command line and credentials (started only on request: `RealNode.start_network_policies`); real_node:
`RealNode`, its start and stop.
"""

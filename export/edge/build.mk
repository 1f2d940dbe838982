# export/edge/build.mk - builds the eBPF enforcer and the ccs-edge agent into export/build/.
# Included by the main Makefile (`-include export/edge/build.mk`); `make edge` builds it all
# (or `make -f export/edge/build.mk edge`), from the repository root.
# Every variable is EDGE_-prefixed so nothing clashes with the main Makefile.

EDGE_SRC      := export/edge
EDGE_OUT      := export/build
EDGE_CLANG    ?= clang
EDGE_CC       ?= cc
EDGE_BPFTOOL  ?= bpftool
EDGE_VMLINUX_BTF ?= /sys/kernel/btf/vmlinux
EDGE_ARCH     := $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
EDGE_INCLUDES := -I$(EDGE_OUT) -I$(EDGE_SRC)
EDGE_BPF_CFLAGS := -g -O2 -target bpf -D__TARGET_ARCH_$(EDGE_ARCH) -D__BPF__ -Wall -Wno-unused-function
EDGE_CFLAGS   ?= -O2 -g -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-format-truncation
EDGE_LDLIBS   := -lbpf -lelf -lz -lcrypto -lcjson
EDGE_HDRS     := $(EDGE_SRC)/ccs_table.h $(EDGE_SRC)/ccs.h
# the agent: ccs.c (main) and one file per concern, sharing agent.h
EDGE_AGENT_SRCS := $(addprefix $(EDGE_SRC)/,ccs.c config.c util.c attach.c manifest.c table.c \
                     table_verify.c table_rule.c table_index.c table_slots.c floor.c \
                     routes.c status.c translog.c metrics.c)

.PHONY: edge edge-clean
edge: $(EDGE_OUT)/ccs-edge $(EDGE_OUT)/ccs-loadgen

$(EDGE_OUT)/.dir:
	@mkdir -p $(EDGE_OUT) && touch $@

# vmlinux.h is generated from the running kernel's BTF, never committed.
$(EDGE_OUT)/vmlinux.h: | $(EDGE_OUT)/.dir
	$(EDGE_BPFTOOL) btf dump file $(EDGE_VMLINUX_BTF) format c > $@.tmp && mv $@.tmp $@

$(EDGE_OUT)/ccs.bpf.o: $(EDGE_SRC)/ccs.bpf.c $(EDGE_HDRS) $(EDGE_OUT)/vmlinux.h
	$(EDGE_CLANG) $(EDGE_BPF_CFLAGS) $(EDGE_INCLUDES) -c $< -o $@

$(EDGE_OUT)/ccs.skel.h: $(EDGE_OUT)/ccs.bpf.o
	$(EDGE_BPFTOOL) gen skeleton $< name ccs_bpf > $@.tmp && mv $@.tmp $@

# one compiler run over all the agent's files: a second or two, no object files to track
$(EDGE_OUT)/ccs-edge: $(EDGE_AGENT_SRCS) $(EDGE_SRC)/agent.h $(EDGE_SRC)/table.h $(EDGE_OUT)/ccs.skel.h $(EDGE_HDRS)
	$(EDGE_CC) $(EDGE_CFLAGS) $(EDGE_INCLUDES) $(EDGE_AGENT_SRCS) -o $@ $(EDGE_LDLIBS)

# accept-rate load generator for bench/kernel.py
$(EDGE_OUT)/ccs-loadgen: $(EDGE_SRC)/loadgen.c | $(EDGE_OUT)/.dir
	$(EDGE_CC) $(EDGE_CFLAGS) $< -o $@

edge-clean:
	rm -rf $(EDGE_OUT)

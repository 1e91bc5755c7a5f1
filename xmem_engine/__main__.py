from xmem_engine.cli import main

raise SystemExit(main())

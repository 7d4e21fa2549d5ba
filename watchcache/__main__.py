from watchcache.cli import main

raise SystemExit(main())
